"""The executor side of a read (:class:`BatchDecoder`) gives what the per-record decoder gives, message by
message, whichever path a block takes: keys, tombstones and TOAST placeholders across blocks."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from cdcflow.connectors.spark.decode import BLOCK_SIZE, BatchDecoder
from cdcflow.connectors.spark.read_plan import plan_read
from cdcflow.core.model import Change
from cdcflow.core.rowkind import RowKind
from cdcflow.formats import DecodeOutput, Message, parse_ddl, render_change, resolve_format
from cdcflow.formats.debezium.envelope import PLACEHOLDER

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
    from cdcflow.connectors.spark.dead_letters import read_dead_letters

    (letter,) = read_dead_letters(str(dead))
    assert (letter["line"], letter["field"]) == (32, "after.id")


def control_messages() -> list[Message]:
    """A block's worth of inserts (decoded columnar), then a truncate, an insert and a logical message."""
    messages = [event(i, i, "c", None, {"id": i, "name": f"n{i}"}) for i in range(BLOCK_SIZE)]
    source = {"table": "t", "lsn": 7}
    messages.append(
        Message(
            orjson.dumps({"op": "t", "before": None, "after": None, "source": source}),
            None,
            "t",
            0,
            BLOCK_SIZE,
        )
    )
    messages.append(event(BLOCK_SIZE + 1, 5, "c", None, {"id": 5, "name": "after"}))
    messages.append(
        Message(
            orjson.dumps({"op": "m", "source": source, "message": {"prefix": "p"}}),
            b'{"prefix":"p"}',
            "t",
            0,
            BLOCK_SIZE + 2,
        )
    )
    return messages


def control_plan(control_events: str) -> Any:
    raw = {
        "kafka.bootstrap.servers": "unused:9092",
        "subscribe": "t",
        "columns": COLUMNS,
        "metadata": "offset,source.table,source.lsn",
        "controlEvents": control_events,
    }
    return plan_read("debezium-json", raw, None)


def test_emitted_control_events_are_rows_at_their_place() -> None:
    plan = control_plan("emit")
    assert plan.output["_row_kind"].nullable and plan.output["_control"].nullable
    assert plan.output["id"].nullable  # declared NOT NULL, but a control row has no id
    rows = [row for batch in BatchDecoder(plan).batches(control_messages()) for row in batch.to_pylist()]
    assert len(rows) == BLOCK_SIZE + 3
    assert {(r["_row_kind"], r["_control"]) for r in rows[:BLOCK_SIZE]} == {("+I", None)}
    assert rows[BLOCK_SIZE:] == [
        {
            "id": None,
            "name": None,
            "source_table": "t",
            "source_lsn": 7,
            "_row_kind": None,
            "_control": "truncate",
            "offset": BLOCK_SIZE,
        },
        {
            "id": 5,
            "name": "after",
            "source_table": None,
            "source_lsn": None,
            "_row_kind": "+I",
            "_control": None,
            "offset": BLOCK_SIZE + 1,
        },
        {
            "id": None,
            "name": None,
            "source_table": "t",
            "source_lsn": 7,
            "_row_kind": None,
            "_control": "message",
            "offset": BLOCK_SIZE + 2,
        },
    ]


def test_skipped_control_events_leave_no_row_and_the_row_kind_not_null(caplog: Any) -> None:
    plan = control_plan("skip")
    assert not plan.output["_row_kind"].nullable and "_control" not in plan.output.fieldNames()
    rows = [row for batch in BatchDecoder(plan).batches(control_messages()) for row in batch.to_pylist()]
    assert [r["offset"] for r in rows] == [*range(BLOCK_SIZE), BLOCK_SIZE + 1]
    assert "truncate event not in the changelog" in caplog.text


def test_emitted_control_events_of_a_plain_file_keep_their_line(tmp_path: Any) -> None:
    """Plain files are decoded a chunk at a time by the columnar decoder, which leaves a chunk with a
    control event to the per-line path: the event's row carries its line."""
    lines = [orjson.dumps({"before": None, "after": {"id": i, "name": "x"}, "op": "c"}) for i in range(20)]
    lines.insert(7, orjson.dumps({"op": "t", "before": None, "after": None, "source": {"table": "t"}}))
    path = tmp_path / "changes.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    raw = {"path": str(path), "columns": COLUMNS, "metadata": "line", "controlEvents": "emit"}
    plan = plan_read("debezium-json", raw, None)
    rows = [
        r for b in BatchDecoder(plan).file_batches(str(path), 0, path.stat().st_size) for r in b.to_pylist()
    ]
    assert [(r["line"], r["_control"], r["_row_kind"]) for r in rows] == [
        (n, "truncate" if n == 8 else None, None if n == 8 else "+I") for n in range(1, 22)
    ]


def test_key_metadata_makes_kafka_reads_fetch_headers_without_adding_the_headers_column() -> None:
    raw = {"kafka.bootstrap.servers": "unused:9092", "subscribe": "t", "columns": COLUMNS}
    plan = plan_read("debezium-json", {**raw, "metadata": "old-key,new-key"}, None)
    assert plan.include_headers and "headers" not in plan.output.fieldNames()
    assert not plan_read("debezium-json", {**raw, "metadata": "offset"}, None).include_headers
    headers = (("__debezium.oldkey", b'{"id":1}'),)
    pk_change = Message(
        orjson.dumps({"op": "c", "before": None, "after": {"id": 2, "name": "x"}}), headers=headers
    )
    (row,) = BatchDecoder(plan).batches([pk_change]).__next__().to_pylist()
    assert (row["id"], row["old_key"], row["new_key"]) == (2, '{"id":1}', None)


def _outcomes(metrics: Any) -> tuple[int, ...]:
    return (
        metrics.messages,
        metrics.changed_messages,
        metrics.changes,
        metrics.dead_letters,
        metrics.events,
        metrics.filtered,
        metrics.tombstones,
        metrics.empty,
    )


def test_the_columnar_path_counts_each_message_as_the_per_record_decoder_does(tmp_path: Any) -> None:
    """Accounting (docs/connectors.md, "Every message is accounted for") whichever path a block takes:
    Kafka blocks with tombstones, and plain-file chunks with blank lines, read by the columnar decoder."""
    messages = blocks_apart(keyed=False)
    messages[5] = tombstone(5, 5)
    updates = [
        event(BLOCK_SIZE + 3 + i, None, "u", {"id": i, "name": "a"}, {"id": i, "name": "b"}) for i in range(3)
    ]
    messages += updates
    options = {"unavailable-values": "report"}
    reference = resolve_format("debezium-json").create_decoder(options, SCHEMA).decode_all(messages).metrics
    raw = {"kafka.bootstrap.servers": "unused:9092", "subscribe": "t", "columns": COLUMNS, **options}
    kafka = BatchDecoder(plan_read("debezium-json", raw, None))
    assert kafka._columnar is not None
    columnar_blocks = []
    decode = kafka._columnar.decode
    kafka._columnar.decode = lambda *args: columnar_blocks.append(decode(*args)) or columnar_blocks[-1]  # type: ignore[method-assign]
    for _ in kafka.batches(messages):
        pass
    assert any(block is not None for block in columnar_blocks)
    assert _outcomes(kafka.metrics) == _outcomes(reference)
    assert kafka.metrics.tombstones == 2 and kafka.metrics.unaccounted() == 0

    lines = [m.value for m in messages if m.value is not None and PLACEHOLDER.encode() not in m.value]
    path = tmp_path / "changes.jsonl"
    path.write_bytes(b"\n".join(lines[:100]) + b"\n\n  \n" + b"\n".join(lines[100:]) + b"\n")
    on_file = BatchDecoder(plan_read("debezium-json", {"path": str(path), "columns": COLUMNS}, None))
    assert on_file.reads_lines
    for _ in on_file.file_batches(str(path), 0, path.stat().st_size):
        pass
    by_line = resolve_format("debezium-json").create_decoder({}, SCHEMA)
    want = by_line.decode_all([Message(line) for line in lines]).metrics
    assert _outcomes(on_file.metrics) == _outcomes(want)
    assert on_file.metrics.changes == len(lines) + len(updates)
