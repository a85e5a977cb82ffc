"""The source table each format reads off a message (:meth:`FormatFactory.source_table`), on recorded
data: the PostgreSQL recording's tables are ``cdcflow.inventory.*`` (scripts/record_postgres_debezium.py),
Flink's Canal recording mixes four tables of ``mydb``, its Maxwell one is ``test.product`` and its OGG
one ``OGG.TBL_TEST``."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from cdcflow.formats import resolve_format
from cdcflow.formats.source_tables import SourceTable

HERE = Path(__file__).parent
POSTGRES = HERE / "recorded" / "postgres"
FLINK = HERE / "testdata" / "flink"


def named(format_name: str, path: Path) -> Counter[str | None]:
    factory = resolve_format(format_name)
    values = [line.encode() for line in path.read_text().splitlines() if line.startswith("{")]
    return Counter(t.qualified if (t := factory.source_table(value)) else None for value in values)


@pytest.mark.parametrize("recording", ["schemas.jsonl", "no-schemas.jsonl"])
def test_debezium_names_the_table_of_its_source_block_in_either_converter_form(recording: str) -> None:
    factory = resolve_format("debezium-json")
    found: dict[str, set[SourceTable | None]] = {}
    for line in (POSTGRES / recording).read_text().splitlines():
        record = json.loads(line)
        value = record["value"].encode() if record["value"] is not None else None
        found.setdefault(record["topic"], set()).add(factory.source_table(value))
    tables = {
        name: SourceTable("cdcflow", "inventory", name)
        for name in ("cdc_small", "cdc_types", "cdc_types_full")
    }
    assert found == {
        "cdcflow.inventory.cdc_small": {tables["cdc_small"]},
        # the tombstones after deletes name none
        "cdcflow.inventory.cdc_types": {tables["cdc_types"], None},
        "cdcflow.inventory.cdc_types_full": {tables["cdc_types_full"], None},
        "cdcflow.message": {None},  # a logical decoding message: no table
    }
    assert tables["cdc_small"].qualified == "cdcflow.inventory.cdc_small"


def test_canal_maxwell_and_ogg_name_the_table_of_their_envelope() -> None:
    assert named("canal-json", FLINK / "canal-data-filter-table.txt") == {
        "mydb.product": 10,
        "mydb.orders": 4,
        "mydb.project": 1,
        "mydb.projects": 1,
    }
    assert named("maxwell-json", FLINK / "maxwell-data.txt") == {"test.product": 20}
    ogg = resolve_format("ogg-json").source_table((FLINK / "ogg-data.txt").read_bytes().splitlines()[0])
    assert ogg == SourceTable(None, "OGG", "TBL_TEST")
    assert ogg.qualified == "OGG.TBL_TEST"


@pytest.mark.parametrize(
    "value", [None, b"", b"null", b"[]", b"not json", b'{"payload": null}', b'{"table": ""}']
)
def test_a_message_that_names_no_table_gives_none(value: bytes | None) -> None:
    for name in ("debezium-json", "canal-json", "maxwell-json", "ogg-json"):
        assert resolve_format(name).source_table(value) is None
