"""The executor side of a read (:class:`BatchDecoder`) gives what the per-record decoder gives, message by
message, whichever path a block takes: keys, tombstones and TOAST placeholders across blocks."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from cdcflow.connectors.decode_batches import BLOCK_SIZE, BatchDecoder
from cdcflow.connectors.read_plan import plan_read
from cdcflow.core.model import Change
from cdcflow.core.rowkind import RowKind
from cdcflow.formats import DecodeOutput, Message, parse_ddl, render_change, resolve_format
from cdcflow.formats.debezium import PLACEHOLDER

COLUMNS = "id INT NOT NULL, name STRING"
SCHEMA = parse_ddl(COLUMNS)


def event(offset: int, key: int | None, op: str, before: Any, after: Any) -> Message:
    value = orjson.dumps({"before": before, "after": after, "op": op})
    return Message(value, None if key is None else orjson.dumps({"id": key}), "t", 0, offset)


def tombstone(offset: int, key: int) -> Message:
    return Message(None, orjson.dumps({"id": key}), "t", 0, offset)


def blocks_apart(keyed: bool) -> list[Message]:
    """A block of inserts, then an update whose name Debezium did not send (unchanged TOAST) and a
    delete with its tombstone, in the next block."""
    messages = [
        event(i, i if keyed else None, "c", None, {"id": i, "name": f"n{i}"}) for i in range(BLOCK_SIZE)
    ]
    toasted = {"id": 0, "name": PLACEHOLDER}
    messages.append(event(BLOCK_SIZE, 0 if keyed else None, "u", toasted, toasted))
    messages.append(event(BLOCK_SIZE + 1, 1 if keyed else None, "d", {"id": 1, "name": "n1"}, None))
    messages.append(tombstone(BLOCK_SIZE + 2, 1))
    return messages


def expected(options: dict[str, str], messages: list[Message]) -> list[tuple[int | None, str]]:
    decoder = resolve_format("debezium-json").create_decoder(options, SCHEMA)
    out: list[tuple[int | None, str]] = []
    for message in messages:
        decoded = DecodeOutput()
        decoder.decode(message, decoded)
        out += [(message.offset, render_change(change, SCHEMA)) for change in decoded.changes]
    return out


def decoded(options: dict[str, str], messages: list[Message]) -> list[tuple[int | None, str]]:
    raw = {
        "kafka.bootstrap.servers": "unused:9092",
        "subscribe": "t",
        "columns": COLUMNS,
        "metadata": "offset",
    }
    plan = plan_read("debezium-json", {**raw, **options}, None)
    rows = [row for batch in BatchDecoder(plan).batches(messages) for row in batch.to_pylist()]
    return [
        (row["offset"], render_change(Change(RowKind.from_short_string(row["_row_kind"]), row), SCHEMA))
        for row in rows
    ]


@pytest.mark.parametrize("unavailable", ["fill", "report"])
@pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "no-keys"])
def test_blocks_decode_as_the_per_record_decoder_does(unavailable: str, keyed: bool) -> None:
    options = {"unavailable-values": unavailable}
    messages = blocks_apart(keyed)
    want = expected(options, messages)
    assert decoded(options, messages) == want
    if keyed and unavailable == "fill":
        # The name comes from the insert, a block earlier, kept per Kafka key.
        assert want[-3:-1] == [(BLOCK_SIZE, "-U[0, null]"), (BLOCK_SIZE, "+U[0, n0]")]


def test_file_chunks_give_the_per_line_changelog_with_line_numbers(tmp_path: Any) -> None:
    """Plain files go to the columnar decoder a chunk of lines at a time; a chunk it refuses (here a
    bad line, dead-lettered) is decoded line by line. Either way: the same rows and line numbers."""
    lines = [
        orjson.dumps({"before": None, "after": {"id": i, "name": f"n{i}"}, "op": "c"}) for i in range(50)
    ]
    lines[30] = b'{"op": "c", "after": {"id": "x"}}'
    lines.insert(10, b"")
    path = tmp_path / "changes.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    dead = tmp_path / "dead"
    raw = {"path": str(path), "columns": COLUMNS, "metadata": "file,line", "deadLetterPath": str(dead)}
    plan = plan_read("debezium-json", raw, None)
    decoder = BatchDecoder(plan)
    assert decoder.reads_lines
    size = path.stat().st_size
    got = []
    for start, end in ((0, size // 3), (size // 3, size)):
        for batch in BatchDecoder(plan).file_batches(str(path), start, end):
            got += [(row["line"], row["id"], row["_row_kind"], row["file"]) for row in batch.to_pylist()]
    want = [
        (number, orjson.loads(line)["after"]["id"], "+I", str(path))
        for number, line in enumerate(lines, start=1)
        if line and number != 32
    ]
    assert got == want
    from cdcflow.connectors.dead_letters import read_dead_letters

    (letter,) = read_dead_letters(str(dead))
    assert (letter["line"], letter["field"]) == (32, "after.id")
