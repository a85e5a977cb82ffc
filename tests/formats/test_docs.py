"""docs/formats.md lists every option of every format, as declared."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdcflow.formats import available_formats, resolve_format

DOCS = (Path(__file__).parent.parent.parent / "docs" / "formats.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", available_formats())
def test_docs_list_the_options_as_declared(name: str) -> None:
    factory = resolve_format(name)
    assert f"### `{name}`" in DOCS
    assert factory.options.markdown() in DOCS, f"regenerate the options table of {name} in docs/formats.md"
