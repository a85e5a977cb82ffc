"""Hostile input: whatever a message holds, decoding it ends in exactly one counted outcome, never a raw
exception, and a dead letter keeps the message's exact bytes and coordinates (issue 12).

The seeded fuzz run mutates the recorded corpora of every format (``fuzz_corpus.py``; ``bench/fuzz.py``
runs the same harness on 200k+ messages). The suite runs with ``CDCFLOW_STRICT_DECODE=1``
(``tests/conftest.py``): an exception that is not the record's fault is raised, so a bug in a value
conversion fails here instead of hiding in a dead letter.
"""

from __future__ import annotations

import datetime as dt
import os
from collections import Counter
from typing import Any

import orjson
import pytest
from fuzz_corpus import Failure, Tally, Target, minimize, run, summary_lines, targets

from cdcflow.formats import DecodeError, DecodeOutput, Message, parse_ddl, resolve_format
from cdcflow.formats.base import STRICT_DECODE_ENV, Decoded, Decoder, FormatMetrics
from cdcflow.formats.errors import MAX_REASON, FieldError, FormatError, exception_text, excerpt
from cdcflow.formats.types import Schema

MESSAGES = 15_000
#: Rotate it with CDCFLOW_FUZZ_SEED (as tests/connectors/test_source_fuzz.py).
SEED = int(os.environ.get("CDCFLOW_FUZZ_SEED", "12"))
#: Only a hang fails here; the 100 ms bound per message is bench/fuzz.py's to print.
HANG_SECONDS = 5.0
TARGETS = targets()


@pytest.fixture(scope="module")
def tally() -> Tally:
    return run(TARGETS, MESSAGES, SEED, big=100_000, slow_after=HANG_SECONDS)


def _show(failures: list[Failure]) -> str:
    by_kind = Counter((f.format, f.error, f.where) for f in failures)
    lines = [f"{n} x {fmt}: {error} at {where}" for (fmt, error, where), n in by_kind.most_common()]
    first: dict[tuple[str, str, str], Failure] = {}
    for failure in failures:
        first.setdefault((failure.format, failure.error, failure.where), failure)
    by_name = {t.name: t for t in TARGETS}
    for failure in list(first.values())[:8]:
        smallest = minimize(by_name[failure.target], failure)
        lines.append(
            f"{failure.target}: {failure.error}: {failure.text}\n    input: {excerpt(smallest, 300)}"
        )
    return "\n".join(lines)


def test_every_format_is_fuzzed_with_every_outcome(tally: Tally) -> None:
    formats = {t.format for t in TARGETS}
    assert formats == {
        "debezium-json",
        "debezium-avro-confluent",
        "canal-json",
        "maxwell-json",
        "ogg-json",
        "generic",
        "upsert-kafka",
        "debezium-json-registry",
    }
    assert any(t.options.get("schema-include") == "true" for t in TARGETS)
    assert any(t.metadata for t in TARGETS)
    # The log positions and the columnar path's metadata, on messages without schema blocks too.
    assert any("source.sequence" in t.metadata and not t.options.get("schema-include") for t in TARGETS)
    metrics = tally.metrics
    # The mutator neither breaks everything nor nothing.
    assert metrics.changed_messages > MESSAGES // 10
    assert metrics.dead_letters > MESSAGES // 10
    assert metrics.events and metrics.filtered and metrics.tombstones


def test_no_message_raises(tally: Tally) -> None:
    assert tally.raised == [], "\n".join(summary_lines(tally)) + "\n" + _show(tally.raised)


def test_every_message_is_accounted_for(tally: Tally) -> None:
    assert tally.unaccounted == []
    metrics = tally.metrics
    assert metrics.messages + len(tally.raised) == tally.sent == MESSAGES
    assert metrics.unaccounted() == 0


def test_dead_letters_keep_their_exact_bytes_and_coordinates(tally: Tally) -> None:
    assert tally.not_exact == []


def test_no_message_hangs(tally: Tally) -> None:
    assert tally.slow_count == 0, tally.slow


# The boundary itself ----------------------------------------------------------------------------------


class Exploding(Decoder):
    """A format whose conversion fails with ``error``."""

    format_name = "exploding"
    schema = Schema(())

    def __init__(self, error: BaseException, *, ignore_parse_errors: bool = True) -> None:
        super().__init__(ignore_parse_errors=ignore_parse_errors)
        self.error = error

    def decode_message(self, message: Message, metrics: FormatMetrics) -> Decoded:
        raise self.error


RECORD = Message(b'{"op":"c"}', key=b"k", topic="orders", partition=3, offset=41)


@pytest.fixture
def production(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(STRICT_DECODE_ENV, raising=False)


@pytest.mark.parametrize(
    "error",
    [
        RecursionError("maximum recursion depth exceeded"),
        OverflowError("date value out of range"),
        ValueError("Exceeds the limit (4300 digits) for integer string conversion"),
        TypeError("unhashable type: 'list'"),
        AttributeError("'list' object has no attribute 'get'"),
        KeyError("scale"),
        IndexError("list index out of range"),
        UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_an_internal_error_is_dead_lettered_and_counted(production: None, error: Exception) -> None:
    out = DecodeOutput()
    Exploding(error).decode(RECORD, out)
    [letter] = out.dead_letters
    assert letter.message is RECORD
    assert letter.reason.startswith(f"internal error in cdcflow ({type(error).__name__}: ")
    assert "cdcflow bug" in letter.reason
    assert (out.metrics.messages, out.metrics.dead_letters, out.metrics.internal_errors) == (1, 1, 1)
    assert out.metrics.unaccounted() == 0


def test_strict_mode_raises_an_internal_error_as_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(STRICT_DECODE_ENV, "1")
    out = DecodeOutput()
    with pytest.raises(TypeError, match="unhashable"):
        Exploding(TypeError("unhashable type: 'list'")).decode(RECORD, out)
    assert out.dead_letters == [] and out.metrics.internal_errors == 0


def test_an_internal_error_without_ignore_parse_errors_is_a_decode_error_with_coordinates(
    production: None,
) -> None:
    cause = KeyError("scale")
    with pytest.raises(DecodeError) as raised:
        Exploding(cause, ignore_parse_errors=False).decode(RECORD, DecodeOutput())
    text = str(raised.value)
    assert "topic 'orders' partition 3 offset 41" in text
    assert "internal error in cdcflow (KeyError: 'scale')" in text
    assert raised.value.__cause__ is cause  # the traceback to report
    assert raised.value.value == RECORD.value and raised.value.key == RECORD.key


def test_a_record_error_without_ignore_parse_errors_names_the_field(production: None) -> None:
    with pytest.raises(DecodeError, match=r"offset 41, field 'after.id': expected an integer") as raised:
        Exploding(FieldError("after.id", "expected an integer"), ignore_parse_errors=False).decode(
            RECORD, DecodeOutput()
        )
    assert raised.value.__cause__ is None


@pytest.mark.parametrize("error", [MemoryError(), FormatError("the Schema Registry is unreachable")])
def test_what_is_not_the_records_fault_is_not_dead_lettered(production: None, error: Exception) -> None:
    out = DecodeOutput()
    with pytest.raises(type(error)):
        Exploding(error).decode(RECORD, out)
    assert out.dead_letters == []


def test_a_reason_is_bounded(production: None) -> None:
    out = DecodeOutput()
    Exploding(FieldError("data", "x" * 1_000_000)).decode(RECORD, out)
    Exploding(ValueError("y" * 1_000_000)).decode(RECORD, out)
    assert [len(letter.reason) <= MAX_REASON + 3 for letter in out.dead_letters] == [True, True]


class _BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


class _BadStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str")


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (_nested(100_000), "[[[[...]]]]"),
        (10**5000, "<an integer of about 5000 digits>"),
        (_BadRepr(), "<_BadRepr"),
        ("é" * 1_000_000, "'" + "é" * 27),
        ({"a": {"b": {"c": {"d": 1}}}}, "{'a': {'b': {'c': {...}}}}"),
        (dt.datetime(1, 1, 1), "datetime.datetime(1, 1, 1, 0, 0)"),
    ],
    ids=["deep", "huge-int", "bad-repr", "long-text", "dict", "datetime"],
)
def test_an_excerpt_never_fails_and_is_short(value: Any, shown: str) -> None:
    text = excerpt(value)
    assert text.startswith(shown) and len(text) <= 63


def test_exception_text_never_fails() -> None:
    assert exception_text(_BadStr()) == "_BadStr"
    assert exception_text(ValueError("z" * 5000), 100) == "z" * 100 + "..."


def test_a_deep_value_in_an_error_message_is_a_dead_letter_not_a_recursion_error() -> None:
    # 1000 levels inside a STRING value of a generic row whose op code is that value.
    decoder = resolve_format("generic").create_decoder(
        {"ignore-parse-errors": "true", "op-mapping": "c=INSERT;d=DELETE"}, parse_ddl("id INT, name STRING")
    )
    value = b'{"id":1,"op":' + b"[" * 1000 + b"]" * 1000 + b"}"
    out = decoder.decode_all([Message(value, topic="t", partition=0, offset=7)])
    [letter] = out.dead_letters
    assert letter.field == "op" and letter.message.value == value
    assert out.metrics.unaccounted() == 0


# Accounting --------------------------------------------------------------------------------------------


def test_a_canal_message_without_rows_moves_a_counter() -> None:
    decoder = resolve_format("canal-json").create_decoder(
        {"ignore-parse-errors": "true"}, parse_ddl("id INT")
    )
    message = Message(b'{"data":[],"type":"INSERT","database":"d","table":"t"}', file="c.txt", line=3)
    out = decoder.decode_all([message])
    assert out.changes == []
    assert out.metrics.messages == out.metrics.accounted() == 1


def test_a_message_that_decodes_to_no_change_is_counted_as_empty() -> None:
    class NoRows(Exploding):
        def decode_message(self, message: Message, metrics: FormatMetrics) -> Decoded:
            return []

    out = DecodeOutput()
    NoRows(ValueError()).decode(RECORD, out)
    assert (out.metrics.messages, out.metrics.empty) == (1, 1)
    assert out.metrics.unaccounted() == 0


def test_a_skipped_generic_record_is_one_dead_letter_and_nothing_else() -> None:
    decoder = resolve_format("generic").create_decoder(
        {"op-mapping": "c=INSERT", "invalid-op-handling": "SKIP"}, parse_ddl("id INT")
    )
    out = decoder.decode_all(
        [
            Message(orjson.dumps({"id": 1, "op": op}), topic="t", partition=0, offset=n)
            for n, op in enumerate("cxc")
        ]
    )
    assert [(d.message.offset, d.field) for d in out.dead_letters] == [(1, "op")]
    metrics = out.metrics
    assert (metrics.messages, metrics.changed_messages, metrics.dead_letters, metrics.empty) == (3, 2, 1, 0)
    assert metrics.unaccounted() == 0


def test_outcomes_add_up_to_the_messages_read() -> None:
    messages = [
        Message(b'{"op":"c","before":null,"after":{"id":1}}', offset=0),
        Message(b'{"op":"u","before":{"id":1},"after":{"id":2}}', offset=1),  # 2 changes, 1 message
        Message(None, offset=2),  # tombstone
        Message(b'{"op":"t","before":null,"after":null}', offset=3),  # control event
        Message(b'{"op":"c","before":null,"after":{"id":"x"}}', offset=4),  # dead letter
        Message(b"\xff", offset=5),  # dead letter
    ]
    decoder = resolve_format("debezium-json").create_decoder(
        {"ignore-parse-errors": "true"}, parse_ddl("id INT")
    )
    metrics = decoder.decode_all(messages).metrics
    assert (
        metrics.changed_messages,
        metrics.changes,
        metrics.tombstones,
        metrics.events,
        metrics.dead_letters,
    ) == (
        2,
        3,
        1,
        1,
        2,
    )
    assert metrics.messages == metrics.accounted() == len(messages)


def test_a_minimized_failure_still_fails() -> None:
    # The report's inputs come from minimize(): it must keep the failure it shrinks.
    target = Target("t", "debezium-json", {}, "id INT", (Message(b"{}"),))
    failure = Failure("t", "debezium-json", "KeyError", "", "", b'{"a":1}', None)
    assert minimize(target, failure) == b'{"a":1}'  # does not fail at all: returned as it was


@pytest.mark.parametrize(
    ("in_row", "metadata"), [(True, ()), (False, ("schema",))], ids=["cache-key", "schema-column"]
)
def test_a_schema_block_nested_too_deep_for_json_text_is_a_dead_letter(
    in_row: bool, metadata: tuple[str, ...]
) -> None:
    decoder = resolve_format("debezium-json").create_decoder(
        {"ignore-parse-errors": "true", "schema-include": "true"}, None, metadata
    )
    deep = b'"doc":' + b"[" * 300 + b"]" * 300 + b","
    field = b'{"type":"int32","optional":false,"field":"id"}'
    row = b'{"type":"struct",' + (deep if in_row else b"") + b'"optional":true,"field":"%s","fields":['
    row += field + b"]}"
    schema = b'{"type":"struct",' + (b"" if in_row else deep) + b'"fields":['
    schema += row % b"before" + b"," + row % b"after" + b',{"type":"string","optional":false,"field":"op"}]}'
    value = b'{"schema":' + schema + b',"payload":{"op":"c","before":null,"after":{"id":1}}}'
    out = decoder.decode_all([Message(value, topic="t", partition=0, offset=5)])
    [letter] = out.dead_letters
    assert letter.field == "schema" and "nested deeper" in letter.reason and letter.message.value == value
