"""docs/connectors.md lists the connector options as declared."""

from __future__ import annotations

from pathlib import Path

from cdcflow.connectors.spark.options import options_markdown

DOCS = (Path(__file__).parent.parent.parent / "docs" / "connectors.md").read_text(encoding="utf-8")


def test_docs_list_the_connector_options_as_declared() -> None:
    assert options_markdown() in DOCS, "regenerate the options table in docs/connectors.md"
