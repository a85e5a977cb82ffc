"""The columnar Debezium JSON path gives exactly the per-record decoder's changelog, or None.

Differential throughout: the per-record decoder (``debezium-json``) decodes the same block message by
message and its changes become an Arrow batch the way the Spark reader builds them
(:class:`ChangeBatchBuilder`). Whenever the columnar decoder answers, the two batches are equal value
for value (floats compared by their exact repr, so -0.0 and 0.0 differ); where the per-record path
fails, dead-letters or side-outputs anything, the columnar decoder must answer None. Inputs: every
recorded ``debezium-json`` file without a schema block, real Debezium events from PostgreSQL, and
generated blocks; then each reason to fall back on its own.
"""

from __future__ import annotations

import importlib.util
import json
import pickle
import random
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from cdcflow.connectors.spark.arrow_types import ChangeBatchBuilder, arrow_schema, struct_type
from cdcflow.connectors.spark.decode import BatchDecoder
from cdcflow.connectors.spark.read_plan import plan_read
from cdcflow.formats import DecodeError, DecodeOutput, Decoder, Message, Schema, parse_ddl, resolve_format
from cdcflow.formats.base import Headers
from cdcflow.formats.debezium import envelope as envelope_module
from cdcflow.formats.debezium.arrow import _SUSPICIOUS, ColumnarBatch, ColumnarDecoder
from cdcflow.formats.debezium.arrow_columns import _QUOTED, _quoted_pairs
from cdcflow.formats.debezium.arrow_fill import state_keys
from cdcflow.formats.debezium.json import converts_as_declared, state_key_fields

FORMATS_TESTS = Path(__file__).parents[1] / "formats"
RECORDED = FORMATS_TESTS / "recorded" / "postgres" / "no-schemas.jsonl"
RECORDED_BLOCKS = FORMATS_TESTS / "recorded" / "postgres" / "schemas.jsonl"
PRODUCTS = "id INT NOT NULL, name STRING, description STRING, weight DOUBLE"


def _golden_cases() -> list[Any]:
    module = sys.modules.get("golden_cases")
    if module is None:  # tests/formats is on the path only when its tests run too
        spec = importlib.util.spec_from_file_location("golden_cases", FORMATS_TESTS / "golden_cases.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["golden_cases"] = module
        spec.loader.exec_module(module)
    return [case for case in module.all_cases() if case.format == "debezium-json" and _columnar(case)]


def _columnar(case: Any) -> bool:
    """Whether the case's columns have a columnar plan (the schema-include cases' DECIMAL, BINARY and
    nested columns do not: they are read record by record)."""
    decoder = resolve_format("debezium-json").create_decoder(case.options, case.schema, ())
    physical = arrow_schema(struct_type(decoder.schema))
    return ColumnarDecoder.for_decoder(decoder, physical) is not None


@dataclass
class PerRecord:
    rows: list[tuple[Any, ...]]
    message_index: list[int]


@dataclass
class Keyed:
    rows: list[tuple[Any, ...]]
    filled: int
    unfilled: int


class Pair:
    """The columnar decoder of one configuration, and fresh per-record decoders of the same one."""

    def __init__(
        self, ddl: str | Schema, options: dict[str, str] | None = None, metadata: Sequence[str] = ()
    ) -> None:
        self.schema = parse_ddl(ddl) if isinstance(ddl, str) else ddl
        self.options = options or {}
        self.metadata = tuple(metadata)
        output = self.record_decoder().schema
        self.physical = arrow_schema(struct_type(output))
        self.shared = self.record_decoder()
        """The per-record decoder whose filling state the columnar one shares."""
        columnar = ColumnarDecoder.for_decoder(self.shared, self.physical)
        assert columnar is not None
        self.columnar = columnar
        target = pa.schema([*self.physical, pa.field("_row_kind", pa.string())])
        self._builder = ChangeBatchBuilder(output, "_row_kind", target)

    def record_decoder(self) -> Decoder:
        return resolve_format("debezium-json").create_decoder(self.options, self.schema, self.metadata)

    def per_record_keyed(
        self, stream: Sequence[tuple[bytes | None, bytes | None]], decoder: Decoder | None = None
    ) -> Keyed:
        """The per-record changelog of keyed messages, by ``decoder`` (a fresh one by default)."""
        decoder = decoder or self.record_decoder()
        out = DecodeOutput()
        for key, value in stream:
            decoder.decode(Message(value, key=key), out)
        assert not out.dead_letters
        rows = _comparable(self._builder.build(out.changes))
        return Keyed(rows, out.metrics.filled_values, out.metrics.unavailable_values)

    def per_record(
        self, values: Sequence[bytes | None], headers: Sequence[Headers] | None = None
    ) -> PerRecord | None:
        """The per-record changelog, or None if any message fails, is dead-lettered or side-output."""
        decoder, out, origins = self.record_decoder(), DecodeOutput(), []
        for index, value in enumerate(values):
            produced = len(out.changes)
            try:
                decoder.decode(Message(value, headers=headers[index] if headers else ()), out)
            except DecodeError:
                return None
            origins += [index] * (len(out.changes) - produced)
        if out.dead_letters or out.events:
            return None
        return PerRecord(_comparable(self._builder.build(out.changes)), origins)

    def check(
        self, values: Sequence[bytes | None], headers: Sequence[Headers] | None = None, *, fresh: bool = True
    ) -> ColumnarBatch | None:
        """The columnar result, asserted equal to the per-record one whenever it is not None, and the
        same from Arrow arrays of the values (binary, and a slice of a large_binary one, as Spark's
        Kafka source hands them to ``decode_kafka``).

        ``fresh``: by a new copy of the columnar decoder, which parses PostgreSQL's position fields only
        until a block has another connector's (the copies after it may parse them all)."""
        if fresh:
            self.columnar = pickle.loads(pickle.dumps(self.columnar))
        result = self._checked(self.columnar.decode(values, headers=headers), values, headers)
        padded = pa.array([b"{}", *values, None], pa.large_binary()).slice(1, len(values))
        for array in (pa.array(values, pa.binary()), padded):
            same = self.columnar.decode_array(array, headers=headers)
            assert (same is None) == (result is None)
            if same is not None and result is not None:
                assert _comparable(same.rows) == _comparable(result.rows)
                assert same.message_index.to_pylist() == result.message_index.to_pylist()
        return result

    def check_lines(self, block: bytes) -> ColumnarBatch | None:
        """As :meth:`check`, for the lines of a file as the file reader gives them."""
        lines = [line.rstrip(b"\r\n") for line in block.split(b"\n")]
        return self._checked(self.columnar.decode_lines(block), lines)

    def _checked(
        self,
        result: ColumnarBatch | None,
        values: Sequence[bytes | None],
        headers: Sequence[Headers] | None = None,
    ) -> ColumnarBatch | None:
        if result is not None:
            expected = self.per_record(values, headers)
            assert expected is not None, "the columnar path decoded a block the per-record path does not"
            assert result.rows.schema.remove(len(self.physical)) == self.physical
            assert result.rows.schema.field(len(self.physical)).type == pa.string()
            assert _comparable(result.rows) == expected.rows
            assert result.message_index.to_pylist() == expected.message_index
        return result


def _comparable(batch: pa.RecordBatch) -> list[tuple[Any, ...]]:
    return [tuple(repr(v) if isinstance(v, float) else v for v in row.values()) for row in batch.to_pylist()]


def envelope(op: str, before: dict[str, Any] | None = None, after: dict[str, Any] | None = None) -> bytes:
    return orjson.dumps({"before": before, "after": after, "source": {"lsn": 1}, "op": op})


ROW = {"id": 1, "name": "scooter", "description": "small", "weight": 3.14}
ROW2 = {**ROW, "weight": 5.5}

# ------------------------------------------------------------------------------------- recorded inputs


@pytest.mark.parametrize("case", _golden_cases(), ids=lambda case: case.case_id)
def test_recorded_files_decode_as_per_record(case: Any) -> None:
    pair = Pair(case.schema, case.options)
    values = [message.value for message in case.messages()]
    result = pair.check(values)
    # The columnar path takes every recorded file the per-record path reads without an error, under
    # schema-include those whose schema blocks give each declared column its declared type.
    readable = pair.per_record(values) is not None
    if case.options.get("debezium-json.schema-include") == "true":
        blocks = [orjson.loads(value)["schema"] for value in values if value]
        readable &= all(
            converts_as_declared(case.schema, block, fail_on_new_columns=False) for block in blocks
        )
    assert (result is None) == (not readable)
    lines = pair.check_lines((FORMATS_TESTS / "testdata" / case.input).read_bytes())
    assert (lines is None) == (result is None)
    for value in values:
        pair.check([value])


def _recorded_postgres(recording: Path = RECORDED) -> dict[str, list[tuple[bytes | None, bytes | None]]]:
    topics: dict[str, list[tuple[bytes | None, bytes | None]]] = {}
    for line in recording.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        key, value = (None if record[k] is None else record[k].encode() for k in ("key", "value"))
        topics.setdefault(record["topic"].rsplit(".", 1)[-1], []).append((key, value))
    return topics


# The columns of the recorded PostgreSQL tables the columnar path reads (no DECIMAL, BINARY, ARRAY).
POSTGRES_COLUMNS = (
    "id INT NOT NULL, c_real FLOAT, c_double DOUBLE, c_smallint SMALLINT, c_bigint BIGINT, "
    "c_boolean BOOLEAN, c_date DATE, c_time TIME(6), c_time3 TIME(3), c_timestamp TIMESTAMP_NTZ(6), "
    "c_timestamp3 TIMESTAMP_NTZ(3), c_json STRING, c_jsonb STRING, c_uuid STRING, c_text STRING, "
    "c_varchar STRING, c_enum STRING, big_text STRING, big_jsonb STRING"
)


def test_real_postgres_events_decode_as_per_record() -> None:
    pair = Pair(POSTGRES_COLUMNS, {"unavailable-values": "report"})
    columnar = 0
    for table in ("cdc_types", "cdc_types_full"):
        messages = _recorded_postgres()[table]
        values = [value for _, value in messages]
        pair.check(values)
        for value in values:
            columnar += pair.check([value]) is not None
    # Placeholders, NaN/Infinity strings and the truncate go per record; the plain events do not.
    assert columnar >= 8


def test_real_postgres_events_with_schema_blocks_decode_as_per_record() -> None:
    """Kafka Connect's default JSON (``schemas.enable``: a schema block in every message): the columnar
    path reads the envelopes under each block as the per-record decoder reads the messages, two tables'
    blocks alternating too, from values and from a file's lines; it takes every message the path
    without blocks takes of the same events."""
    pair = Pair(POSTGRES_COLUMNS, {"unavailable-values": "report", "schema-include": "true"})
    plain = Pair(POSTGRES_COLUMNS, {"unavailable-values": "report"})
    with_blocks, without = _recorded_postgres(RECORDED_BLOCKS), _recorded_postgres()
    types, full = ([value for _, value in with_blocks[table]] for table in ("cdc_types", "cdc_types_full"))
    alternating = [value for both in zip(types, full, strict=True) for value in both]
    for values in (types, full, alternating):
        lines = [v or b"" for v in values]
        assert (pair.check(values) is None) == (pair.check_lines(b"\n".join(lines)) is None)
        assert (pair.check(values) is None) == (pair.check_lines(b"\r\n".join(lines) + b"\r\n\n") is None)
    columnar = 0
    for table in ("cdc_types", "cdc_types_full"):
        for (_, value), (_, bare) in zip(with_blocks[table], without[table], strict=True):
            assert (pair.check([value]) is None) == (plain.check([bare]) is None)
            columnar += pair.check([value]) is not None
    assert columnar >= 8


def test_a_schema_block_the_declared_columns_do_not_match_is_read_per_record() -> None:
    """A block that gives a declared column another type (or, with new columns failing the job, has a
    column not declared) leaves its messages to the per-record decoder, which reads the block."""
    recorded = _recorded_postgres(RECORDED_BLOCKS)["cdc_small"]
    small = [value for _, value in recorded if value and b'"op":"t"' not in value]  # a truncate: per record
    # cdc_small has REPLICA IDENTITY DEFAULT: no before images
    include = {"schema-include": "true", "changelog-mode": "upsert"}
    assert Pair("id INT NOT NULL, label STRING", include).check(small) is not None
    assert Pair("id INT NOT NULL, label STRING", include).check_lines(b"\n".join(small)) is not None
    assert Pair("id BIGINT NOT NULL, label STRING", include).check(small) is not None  # int32: the number
    assert Pair("id SMALLINT NOT NULL, label STRING", include).check(small) is not None
    assert Pair("id INT NOT NULL, label DATE", include).check(small) is None
    assert Pair("id INT NOT NULL", include).check(small) is not None
    # A block's microseconds read as a declared TIMESTAMP(3)'s milliseconds would be 1,000 times off.
    types = [value for _, value in _recorded_postgres(RECORDED_BLOCKS)["cdc_types"] if value]
    millis = POSTGRES_COLUMNS.replace("c_timestamp TIMESTAMP_NTZ(6)", "c_timestamp TIMESTAMP_NTZ(3)")
    for value in types:
        assert Pair(millis, {"schema-include": "true", "unavailable-values": "report"}).check([value]) is None
    schema = parse_ddl("id INT NOT NULL")
    failing = resolve_format("debezium-json").create_decoder(include, schema, ()).failing_on_new_columns()
    columnar = ColumnarDecoder.for_decoder(failing, arrow_schema(struct_type(schema)))
    assert columnar is not None
    assert columnar.decode(small) is None
    assert pickle.loads(pickle.dumps(columnar)).decode(small) is None


def test_messages_without_a_schema_block_under_schema_include_are_read_per_record() -> None:
    pair = Pair(PRODUCTS, {"schema-include": "true"})
    types = {"id": "int32", "name": "string", "description": "string", "weight": "double"}
    fields = [{"type": kind, "field": name} for name, kind in types.items()]
    image = {"type": "struct", "fields": fields, "field": "after"}
    head = b'{"schema":' + orjson.dumps({"type": "struct", "fields": [image]}) + b',"payload":'
    plain = envelope("c", after=ROW)
    assert pair.check([head + plain + b"}"]) is not None
    assert pair.check([head + plain + b"}", plain]) is None
    assert pair.check([head + plain + b"}", b' {"schema":null,"payload":' + plain + b"}"]) is None
    assert pair.check([head + plain + b"} "]) is None
    assert pair.check([head + plain + b"}", None, b"", head + plain + b"}"]) is not None
    for blank in (b"", b"  "):  # a blank payload is no tombstone: the per-record decoder refuses it
        assert pair.check([head + plain + b"}", head + blank + b"}"]) is None
        assert pair.check_lines(head + plain + b"}\n" + head + blank + b"}\n") is None


def keyed_stream(seed: int, messages: int = 400) -> list[tuple[bytes | None, bytes | None]]:
    """(key, value) of Debezium events over 12 keys: inserts, updates whose after (and at times before)
    image leaves ``description`` unsent, deletes, re-inserts, tombstones and keyless messages."""
    rng = random.Random(seed)  # noqa: S311 - test data
    live: dict[int, dict[str, Any]] = {}
    stream: list[tuple[bytes | None, bytes | None]] = []
    unsent = "__debezium_unavailable_value"
    for n in range(messages):
        row_id = rng.randint(1, 12)
        key = None if rng.random() < 0.05 else orjson.dumps({"id": row_id})
        row = {"id": row_id, "name": f"n{n}", "description": f"d{n}", "weight": float(n)}
        if row_id not in live or rng.random() < 0.15:
            after = {**row, "description": unsent} if rng.random() < 0.2 else row
            value = envelope("c", after=after)
        elif rng.random() < 0.15:
            value = envelope("d", before=live.pop(row_id))
            stream.append((key, value))
            if rng.random() < 0.5:
                stream.append((key, None))
            continue
        else:
            before = dict(live[row_id])
            if rng.random() < 0.3:
                before["description"] = unsent
            after = {**row, "description": unsent} if rng.random() < 0.6 else row
            value = envelope("u", before=before, after=after)
        live[row_id] = row
        stream.append((key, value))
    return stream


@pytest.mark.parametrize("state_keys", [None, 5], ids=["state-holds-all", "state-forgets"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_keyed_messages_fill_toast_values_in_columns_as_the_per_record_state_does(
    seed: int, state_keys: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``unavailable-values=fill`` (the default) with Kafka keys: the columnar path fills placeholders
    from the key's earlier message in the block or from the per-record decoder's state, which it shares
    and updates; blocks of any size, in sequence, some through the shared per-record decoder (as a block
    the columnar path refuses goes), equal the per-record decoder's changelog of the whole stream, on
    both entry points. With a state of 5 keys (12 in the stream) keys are forgotten as the per-record
    decoder forgets them, deletes and evictions interleaved."""
    if state_keys is not None:
        monkeypatch.setattr(envelope_module, "FILL_STATE_KEYS", state_keys)
    stream = keyed_stream(seed)
    reference = Pair(PRODUCTS)
    expected = reference.per_record_keyed(stream)
    assert expected.filled > 20 and expected.unfilled > 5, (expected.filled, expected.unfilled)
    rng = random.Random(seed)  # noqa: S311 - block sizes
    for entry in ("decode", "decode_array"):
        pair = Pair(PRODUCTS)
        rows: list[tuple[Any, ...]] = []
        start, columnar, blocks = 0, 0, 0
        counts: list[int] = []  # filled, left unavailable: per block
        while start < len(stream):
            block = stream[start : start + rng.choice([1, 3, 17, 64])]
            start, blocks = start + len(block), blocks + 1
            keys, values = [k for k, _ in block], [v for _, v in block]
            if rng.random() < 0.15:
                result = None
            elif entry == "decode":
                result = pair.columnar.decode(values, keys)
            else:
                binary = pa.binary()
                result = pair.columnar.decode_array(pa.array(values, binary), pa.array(keys, binary))
            if result is not None:
                columnar += 1
                rows += _comparable(result.rows)
                counts += [result.filled_values, result.unavailable_values]
            else:
                fallback = pair.per_record_keyed(list(zip(keys, values, strict=True)), pair.shared)
                rows += fallback.rows
                counts += [fallback.filled, fallback.unfilled]
        assert rows == expected.rows, entry
        assert (sum(counts[0::2]), sum(counts[1::2])) == (expected.filled, expected.unfilled), entry
        assert columnar >= blocks // 2 and blocks >= 5, (entry, columnar, blocks)


@pytest.mark.parametrize(
    "keys",
    [
        [b'{"id":1}', b'{"id":-0}', b'{"id":"caf\\u00e9"}'],
        [b'{"id":"caf\xe9"}', b'{"id":"ok"}'],  # invalid UTF-8: orjson refuses it, Arrow does not
        [b'{"\xff":1}', b'{"\xff":2}'],
        [b'{"id":1} {"id":2}', b""],  # two documents and a blank key: as many lines as keys
        [b'{"id":1}{"id":2}', b" "],
        [b' {"id":1}', b'{"id":2}'],
        [b'{"id":1}', None, b'{"id":1}'],
        [b'{"id":1.5}', b'{"id":2}'],
        [b'{"id":99999999999999999999}'],
        [b'{"a":1,"b":2}', b'{"b":2,"a":1}'],
        [b'{"schema":{"type":"int32"},"payload":{"id":7}}'],
        [b"[1]", b'{"id":1}'],
    ],
)
def test_a_blocks_state_keys_are_the_per_record_decoders(keys: list[bytes | None]) -> None:
    """The keys of a block read at once give each message the state key the per-record decoder makes
    from the same bytes (None where it keeps no state), whatever the bytes."""
    expected = [envelope_module.fields_key(state_key_fields(key)) for key in keys]
    assert state_keys(keys) == expected


def test_real_postgres_events_fill_toast_values_in_columns_as_per_record() -> None:
    recorded = _recorded_postgres()
    stream = [*recorded["cdc_small"], *recorded["cdc_types"], *recorded["cdc_types_full"]]
    schema = POSTGRES_COLUMNS + ", label STRING"
    upsert = {"changelog-mode": "upsert"}  # cdc_small has REPLICA IDENTITY DEFAULT: no before images
    expected = Pair(schema, upsert).per_record_keyed(stream)
    assert expected.filled + expected.unfilled > 0
    pair = Pair(schema, upsert)
    rows, columnar = [], 0
    for at in range(0, len(stream), 5):
        block = stream[at : at + 5]
        result = pair.columnar.decode([v for _, v in block], [k for k, _ in block])
        if result is None:
            rows += pair.per_record_keyed(block, pair.shared).rows
        else:
            columnar += 1
            rows += _comparable(result.rows)
    assert rows == expected.rows and columnar > 0


# ------------------------------------------------------------------------------------ generated blocks

WIDE = (
    "id INT NOT NULL, tiny TINYINT, small SMALLINT, big BIGINT, flag BOOLEAN, name STRING, "
    "label STRING NOT NULL, weight DOUBLE, ratio FLOAT, day DATE, at_ms TIMESTAMP_NTZ(3), "
    "at_us TIMESTAMP, at_ns TIMESTAMP_LTZ(9), clock TIME(6), clock_ms TIME(3), clock_ns TIME(9)"
)
MIN_MICROS, MAX_MICROS = -62_135_596_800_000_000, 253_402_300_799_999_999
DAY_MICROS = 86_400_000_000


def _integers(low: int, high: int) -> st.SearchStrategy[str]:
    return st.one_of(st.integers(low, high), st.sampled_from([low, high, 0])).map(str)


def _floats(width: int) -> st.SearchStrategy[str]:
    plain = st.floats(allow_nan=False, allow_infinity=False)
    if width == 32:  # doubles that round to a FLOAT, and FLOATs themselves
        plain = st.one_of(
            st.floats(-3.4e38, 3.4e38), st.floats(allow_nan=False, allow_infinity=False, width=32)
        )
    texts = st.one_of(
        plain.map(lambda x: repr(abs(x) if x == 0 else x)),  # -0.0: see the fallbacks
        st.integers(-(2**70), 2**70).map(str),
        st.from_regex(r"\A-?[1-9][0-9]{0,24}(\.[0-9]{1,24})?([eE]-?[0-9]{1,2})?\Z"),
    )
    return texts if width == 64 else texts.filter(lambda text: abs(float(text)) < 3.4e38)


TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=12).map(lambda s: orjson.dumps(s).decode())
VALID = {
    "id": _integers(-(2**31), 2**31 - 1),
    "tiny": _integers(-128, 127),
    "small": _integers(-(2**15), 2**15 - 1),
    "big": _integers(-(2**63), 2**63 - 1),
    "flag": st.sampled_from(["true", "false"]),
    "name": TEXT,
    "label": TEXT,
    "weight": _floats(64),
    "ratio": _floats(32),
    "day": _integers(-719_162, 2_932_896),
    "at_ms": _integers(MIN_MICROS // 1000, MAX_MICROS // 1000),
    "at_us": _integers(MIN_MICROS, MAX_MICROS),
    "at_ns": _integers(-(2**63), 2**63 - 1),
    "clock": _integers(0, DAY_MICROS - 1),
    "clock_ms": _integers(0, DAY_MICROS // 1000 - 1),
    "clock_ns": _integers(0, DAY_MICROS * 1000 - 1),
}
NOT_NULL = ("id", "label")
ODD_NUMBERS = ["-0", "-0.0", "1.0", "1e2", '"12"', '" 7 "', "true", "12.5", '"NaN"', '"Infinity"']
ODD_NUMBERS += ['"-Infinity"', "1e400", "NaN", "-Infinity", "1.8e308", "9" * 400, "3.4028236e38", "5e-324"]
ODD_NUMBERS += ["2" + "0" * 19, "-2147483649", "32768"]
ODD_TEXTS = ['"__debezium_unavailable_value"', '"X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ=="', "12", "[1]"]
ODD_TEXTS += ['{"a":1}', '{"scale":2,"value":"AQ=="}', r'"\ud800"', r'"\ud83d\ude00"', r'"a\u0000\"\/"']
ODD = st.sampled_from(["null", '"true"', '"2020-02-29"', *ODD_NUMBERS, *ODD_TEXTS])
ODD_SOURCE = ["NaN", "-Infinity", "Inf", "1.8e308", "1e400", "9" * 400, "[" * 1100 + "]" * 1100, '"\\u00e9"']
ODD_SOURCES = st.sampled_from(ODD_SOURCE)
ODD_OPS = st.sampled_from(['"t"', '"m"', '"x"', '"C"', "null", "1", ""])
ODD_IMAGES = st.sampled_from(["null", "", '"row"', "[]", "{}"])
MUTATIONS = ["truncate", "bom", "spaces", "two", "blank", "empty", "tombstone", "newlines", "bad-utf8", "ff"]
#: How a generated message departs from a plain Debezium event: mostly not at all, else in one place.
FLAWS = st.sampled_from(["none"] * 4 + ["token", "extra-field", "op", "image", "source", "mutation"])
OPS = st.sampled_from("crud")
IMAGE_NAMES = st.sampled_from(["before", "after"])
NULLABLE = {
    name: valid if name in NOT_NULL else st.one_of(valid, st.just("null"), st.just(""))
    for name, valid in VALID.items()
}
ODD_COLUMNS = st.sampled_from(list(VALID))
UNKNOWN_VALUES = st.sampled_from(["1", "{}", "[1,2]", *ODD_SOURCE])
SOURCE = '{"connector":"postgresql","ts_ms":1700000000000,"lsn":24023128}'


@st.composite
def images(draw: st.DrawFn, odd_column: str | None = None) -> str:
    fields = [f'"{name}":{draw(ODD if name == odd_column else NULLABLE[name])}' for name in VALID]
    fields = [field for field in fields if not field.endswith(":")]
    if odd_column == "unknown":
        fields.append(f'"unknown":{draw(UNKNOWN_VALUES)}')
    draw(st.randoms(use_true_random=False)).shuffle(fields)
    return "{" + ",".join(fields) + "}"


@st.composite
def envelopes(draw: st.DrawFn, *, clean: bool) -> bytes | None:
    flaw = "none" if clean else draw(FLAWS)
    op = draw(OPS)
    odd_image = draw(IMAGE_NAMES)
    odd_column = {"token": draw(ODD_COLUMNS), "extra-field": "unknown"}.get(flaw)
    parts = {
        "op": f'"{op}"',
        "before": draw(images(odd_column if odd_image == "before" else None)) if op in "ud" else "null",
        "after": draw(images(odd_column if odd_image == "after" else None)) if op != "d" else "",
        "source": SOURCE,
    }
    if flaw == "op":
        parts["op"] = draw(ODD_OPS)
    elif flaw == "image":
        parts[odd_image] = draw(ODD_IMAGES)
    elif flaw == "source":
        parts["source"] = f'{{"lsn":{draw(ODD_SOURCES)}}}'
    fields = [f'"{k}":{v}' for k, v in parts.items() if v]
    draw(st.randoms(use_true_random=False)).shuffle(fields)
    value = ("{" + ",".join(fields) + "}").encode()
    mutation = draw(st.sampled_from(MUTATIONS)) if flaw == "mutation" else None
    return _mutate(value, mutation, draw(st.integers(0, len(value))))


def _mutate(value: bytes, mutation: str | None, at: int) -> bytes | None:
    if mutation == "truncate":
        return value[:at]
    mutated: dict[str | None, bytes | None] = {
        None: value,
        "bom": b"\xef\xbb\xbf" + value,
        "spaces": b" \t" + value + b"\r\n",
        "two": value + b" " + value,
        "blank": b" \n ",
        "empty": b"",
        "tombstone": None,
        "newlines": value.replace(b",", b",\n  "),
        "bad-utf8": value[:at] + b"\xff" + value[at:],
        "ff": b"\x0c" + value,
    }
    return mutated[mutation]


@cache
def wide() -> Pair:
    return Pair(WIDE)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(envelopes(clean=False), max_size=6))
def test_generated_blocks_decode_as_per_record_or_not_at_all(values: list[bytes | None]) -> None:
    result = wide().check(values)
    event("columnar" if result is not None else "per record")
    lines = wide().check_lines(b"\n".join(value for value in values if value is not None))
    event("lines: columnar" if lines is not None else "lines: per record")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(envelopes(clean=True), min_size=1, max_size=6))
def test_generated_plain_blocks_take_the_columnar_path(values: list[bytes | None]) -> None:
    assert wide().check(values) is not None


# -------------------------------------------------------------------------------------- exact answers


def test_one_row_per_insert_and_delete_two_adjacent_rows_per_update_in_input_order() -> None:
    pair = Pair(PRODUCTS)
    values = [
        envelope("r", after=ROW),
        None,
        envelope("u", before=ROW, after=ROW2),
        b"",
        envelope("c", after={**ROW, "id": 2, "name": None}),
        b" \r\n",
        envelope("d", before=ROW2),
    ]
    result = pair.check(values)
    assert result is not None
    assert result.rows.column("_row_kind").to_pylist() == ["+I", "-U", "+U", "+I", "-D"]
    assert result.message_index.to_pylist() == [0, 2, 2, 4, 6]
    assert result.rows.column("weight").to_pylist() == [3.14, 3.14, 5.5, 3.14, 5.5]


def test_blocks_of_tombstones_or_nothing_give_no_rows() -> None:
    pair = Pair(PRODUCTS)
    for values in ([], [None, b"", b"  "]):
        result = pair.check(values)
        assert result is not None
        assert result.rows.num_rows == 0
        assert result.rows.schema.names == [*pair.physical.names, "_row_kind"]


def test_pretty_printed_and_padded_messages() -> None:
    pretty = json.dumps({"op": "u", "before": ROW, "after": ROW2}, indent=2).encode()
    result = Pair(PRODUCTS).check([pretty, b"\t" + envelope("c", after=ROW) + b" \n"])
    assert result is not None
    assert result.rows.column("_row_kind").to_pylist() == ["-U", "+U", "+I"]


def test_lines_of_a_file_as_the_file_reader_splits_them() -> None:
    pair = Pair(PRODUCTS)
    block = b"\n".join(
        [
            envelope("c", after=ROW) + b"\r",
            b"",
            b"  \t",
            envelope("u", before=ROW, after=ROW2),
            envelope("d", ROW2),
        ]
    )
    for ending in (b"", b"\n", b"\r\n"):
        result = pair.check_lines(block + ending)
        assert result is not None
        assert result.message_index.to_pylist() == [0, 3, 3, 4]
        assert result.rows.column("_row_kind").to_pylist() == ["+I", "-U", "+U", "-D"]
    assert pair.check_lines(b"") is not None


@pytest.mark.parametrize("digits", [149, 150, 151, 300])
def test_long_numbers_are_checked_wherever_they_sit_in_the_block(digits: int) -> None:
    pair = Pair(PRODUCTS)
    for padding in range(0, 72, 9):
        message = envelope("c", after={**ROW, "name": "x" * padding}).replace(
            b'"lsn":1', b'"lsn":' + b"7" * digits
        )
        # orjson reads up to 308 digits as a double; the 300-digit number is fine, and so is the block.
        assert pair.check([message]) is not None
        assert pair.check_lines(b"\n".join([envelope("c", after=ROW)] * padding + [message])) is not None
        overflow = message.replace(b"7" * digits, b"9" * 400)
        assert pair.columnar.decode([message, overflow]) is None
        assert pair.columnar.decode_lines(b"\n".join([message] * padding + [overflow])) is None


def test_temporal_columns_read_debezium_epoch_integers() -> None:
    pair = Pair(
        "id INT NOT NULL, d DATE, ts3 TIMESTAMP_NTZ(3), ts6 TIMESTAMP, ts9 TIMESTAMP_LTZ(9), "
        "t3 TIME(3), t9 TIME(9)"
    )
    row = {
        "id": 1,
        "d": -1,
        "ts3": -1,
        "ts6": 1709212455123456,
        "ts9": -1,
        "t3": 45296789,
        "t9": 86399999999999,
    }
    result = pair.check([envelope("c", after=row)])
    assert result is not None
    assert [str(v) for v in result.rows.to_pylist()[0].values()] == [
        "1",
        "1969-12-31",
        "1969-12-31 23:59:59.999000",
        "2024-02-29 13:14:15.123456+00:00",
        "1969-12-31 23:59:59.999999+00:00",
        "12:34:56.789000",
        "23:59:59.999999",
        "+I",
    ]


def test_float_columns_round_as_the_per_record_path() -> None:
    pair = Pair("id INT NOT NULL, f FLOAT, d DOUBLE")
    values = [
        envelope("c", after={"id": i, "f": x, "d": x})
        for i, x in enumerate([0.1, 1e-46, 3.4028235e38, 1 << 60])
    ]
    assert pair.check(values) is not None


def test_decoder_pickles_to_its_plan() -> None:
    pair = Pair(PRODUCTS)
    copy = pickle.loads(pickle.dumps(pair.columnar))
    values = [envelope("u", before=ROW, after=ROW2)]
    result, again = pair.columnar.decode(values), copy.decode(values)
    assert result is not None and again is not None
    assert again.rows.equals(result.rows)


# ---------------------------------------------------------------------------------------- fallbacks

FALLBACKS = {
    "not JSON": [b"{not json}"],
    "a JSON array": [b"[1]"],
    "null": [b"null"],
    "truncate event": [orjson.dumps({"op": "t", "source": {}})],
    "logical message": [orjson.dumps({"op": "m", "message": {"prefix": "p"}})],
    "unknown op": [envelope("x", after=ROW)],
    "missing op": [orjson.dumps({"after": ROW})],
    "schema and payload form": [orjson.dumps({"schema": {}, "payload": {"op": "c", "after": ROW}})],
    "update without before (REPLICA IDENTITY DEFAULT)": [envelope("u", after=ROW2)],
    "delete without before": [envelope("d")],
    "insert without after": [envelope("c", before=ROW)],
    "TOAST placeholder in after": [
        envelope("u", ROW, {**ROW, "description": "__debezium_unavailable_value"})
    ],
    "TOAST placeholder in before": [envelope("d", {**ROW, "name": "__debezium_unavailable_value"})],
    "base64 TOAST placeholder": [
        envelope("c", after={**ROW, "name": "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ=="})
    ],
    "NULL in a NOT NULL column": [envelope("c", after={**ROW, "id": None})],
    "NOT NULL column missing from an unused image": [envelope("c", before={"name": "x"}, after=ROW)],
    "INT out of range": [envelope("c", after={**ROW, "id": 2**31})],
    "integer as text": [envelope("c", after={**ROW, "id": "7"})],
    "integral float in an INT column": [envelope("c", after={**ROW, "id": 7.0})],
    "NaN as text": [envelope("c", after={**ROW, "weight": "NaN"})],
    "number as text": [envelope("c", after={**ROW, "weight": "2.5"})],
    "number in a STRING column": [envelope("c", after={**ROW, "name": 12})],
    "integer -0 in a DOUBLE column": [envelope("c", after=ROW).replace(b"3.14", b"-0")],
    "NaN literal in a column": [envelope("c", after=ROW).replace(b"3.14", b"NaN")],
    "NaN literal in the source block": [envelope("c", after=ROW).replace(b'"lsn":1', b'"lsn":NaN')],
    "-Infinity literal in the source block": [
        envelope("c", after=ROW).replace(b'"lsn":1', b'"lsn":-Infinity')
    ],
    "number beyond a double in the source block": [
        envelope("c", after=ROW).replace(b'"lsn":1', b'"lsn":1.8e308')
    ],
    "400-digit number in the source block": [
        envelope("c", after=ROW).replace(b'"lsn":1', b'"lsn":' + b"9" * 400)
    ],
    "NaN literal in a message of more than 1000 bytes": [
        envelope("c", after={**ROW, "description": "x" * 1200}).replace(b'"lsn":1', b'"lsn":NaN')
    ],
    "nesting deeper than 1024": [
        envelope("c", after=ROW).replace(b'"lsn":1', b'"l":' + b"[" * 1100 + b"]" * 1100)
    ],
    "nesting deeper than 1024 among many long messages (counted in one pass)": [
        *(envelope("c", after={**ROW, "id": i, "description": "x" * 1200}) for i in range(8)),
        envelope("c", after=ROW).replace(b'"lsn":1', b'"l":' + b"[" * 1100 + b"]" * 1100),
    ],
    "invalid UTF-8 in an ignored field": [envelope("c", after=ROW).replace(b'"lsn":1', b'"x":"\xff"')],
    "UTF-8 of a surrogate in an ignored field": [
        envelope("c", after=ROW).replace(b'"lsn":1', b'"x":"\xed\xa0\x80"')
    ],
    "Infinity in an ignored array": [envelope("c", after=ROW).replace(b'"lsn":1', b'"x":[1, Infinity]')],
    "byte order mark": [b"\xef\xbb\xbf" + envelope("c", after=ROW)],
    "two documents in one message": [envelope("c", after=ROW) + envelope("c", after=ROW)],
    "a form feed around the message": [b"\x0c" + envelope("c", after=ROW)],
    "duplicate key": [envelope("c", after=ROW).replace(b'"op":"c"', b'"op":"c","op":"c"')],
    "FLOAT overflow": [envelope("c", after={"id": 1, "f": 3.5e38})],
}


@pytest.mark.parametrize("values", FALLBACKS.values(), ids=FALLBACKS.keys())
def test_what_the_per_record_path_treats_otherwise_falls_back(values: list[bytes]) -> None:
    pair = Pair(PRODUCTS + ", f FLOAT")
    assert pair.columnar.decode(values) is None
    assert pair.columnar.decode([envelope("c", after=ROW), *values]) is None
    assert pair.columnar.decode_lines(b"\n".join([envelope("c", after=ROW), *values])) is None


def test_ok_control_for_the_fallback_cases() -> None:
    assert Pair(PRODUCTS + ", f FLOAT").check([envelope("c", after={**ROW, "f": 3.4e38})]) is not None


@pytest.mark.parametrize(
    ("message", "suspicious"),
    [
        (b'{"a":1e400}', True),
        (b'{"a": -1.5E+0400}', True),
        (b'{"a":[1,\n 2e300]}', True),
        (b'{"a":NaN}', True),
        (b'{"a":"123e4567-e89b-12d3-a456-426614174000"}', False),  # a UUID: text, no number
        (b'{"a":"x:1e99"}', False),
        (b'{"a":1e99}', False),
    ],
)
def test_an_exponent_is_suspicious_in_a_number_only(message: bytes, suspicious: bool) -> None:
    assert pc.match_substring_regex(pa.array([message]), _SUSPICIOUS)[0].as_py() is suspicious


def test_text_that_only_looks_like_a_literal_or_an_exponent_is_read_columnar() -> None:
    pair = Pair(PRODUCTS)
    texts = ["NaN", "Infinity", ":NaN", "[-Inf", "3e512a1e-4b9e", "1e308", "7" * 200]
    values = [envelope("c", after={**ROW, "id": i, "name": text}) for i, text in enumerate(texts)]
    values.append(envelope("c", after={**ROW, "weight": 1.5e300}).replace(b'"lsn":1', b'"lsn":1e-400'))
    result = pair.check(values)
    assert result is not None
    assert result.rows.column("name").to_pylist()[: len(texts)] == texts


@pytest.mark.parametrize(
    ("ddl", "options", "metadata"),
    [
        (PRODUCTS, {"schema-include": "true"}, ("schema",)),
        (PRODUCTS, {}, ("source.table",)),
        (PRODUCTS, {"key-columns": "id"}, ()),
        (PRODUCTS + ", price DECIMAL(10, 2)", {}, ()),
        (PRODUCTS + ", photo BINARY", {}, ()),
        (PRODUCTS + ", tags ARRAY<STRING>", {}, ()),
        (PRODUCTS + ", dims STRUCT<w: INT>", {}, ()),
    ],
    ids=[
        "the schema block as metadata",
        "metadata",
        "key columns fill the TOAST state",
        "decimal",
        "binary",
        "array",
        "struct",
    ],
)
def test_configurations_without_a_columnar_path(
    ddl: str, options: dict[str, str], metadata: tuple[str, ...]
) -> None:
    schema = parse_ddl(ddl)
    decoder = resolve_format("debezium-json").create_decoder(options, schema, metadata)
    assert ColumnarDecoder.for_decoder(decoder, arrow_schema(struct_type(schema))) is None


def test_key_columns_are_fine_when_nothing_fills_toast_values() -> None:
    schema = parse_ddl(PRODUCTS)
    decoder = resolve_format("debezium-json").create_decoder(
        {"key-columns": "id", "unavailable-values": "fail"}, schema
    )
    assert ColumnarDecoder.for_decoder(decoder, arrow_schema(struct_type(schema))) is not None


@pytest.mark.parametrize(
    "physical",
    [
        pa.schema(
            [
                ("id", pa.int32()),
                ("name", pa.string()),
                ("description", pa.string()),
                ("weight", pa.float64()),
            ]
        ),
        pa.schema(
            [
                pa.field("id", pa.int64(), False),
                ("name", pa.string()),
                ("description", pa.string()),
                ("weight", pa.float64()),
            ]
        ),
        pa.schema(
            [
                pa.field("id", pa.int32(), False),
                ("name", pa.large_string()),
                ("description", pa.string()),
                ("weight", pa.float64()),
            ]
        ),
        pa.schema(
            [
                pa.field("id", pa.int32(), False),
                ("title", pa.string()),
                ("description", pa.string()),
                ("weight", pa.float64()),
            ]
        ),
        pa.schema([pa.field("id", pa.int32(), False), ("name", pa.string())]),
    ],
    ids=["nullability", "int64 for INT", "large_string", "name", "columns"],
)
def test_physical_schema_other_than_sparks_has_no_columnar_path(physical: pa.Schema) -> None:
    decoder = resolve_format("debezium-json").create_decoder({}, parse_ddl(PRODUCTS))
    assert ColumnarDecoder.for_decoder(decoder, physical) is None


def test_other_formats_have_no_columnar_path() -> None:
    schema = parse_ddl(PRODUCTS)
    decoder = resolve_format("canal-json").create_decoder({}, schema)
    assert ColumnarDecoder.for_decoder(decoder, arrow_schema(struct_type(schema))) is None


# ---------------------------------------- metadata and upsert mode (what ``cdcflow ingest`` asks for)

INGEST_OPTIONS = {"changelog-mode": "upsert", "unavailable-values": "report"}
INGEST_METADATA = ("source.sequence", "source.timestamp", "unavailable-columns", "old-key", "new-key")
ALL_METADATA = (*INGEST_METADATA, "ingestion-timestamp", "source.lsn")
PLACEHOLDER = '"__debezium_unavailable_value"'
SOURCES = st.sampled_from(
    [
        '{"connector":"postgresql","sequence":"[\\"24023128\\",\\"24023176\\"]","lsn":24023176,"ts_ms":1}',
        '{"connector":"postgresql","sequence":"[null,\\"24023176\\"]","lsn":24023176,"ts_ms":1700000000000}',
        '{"connector":"postgresql","sequence":"[1,2]","ts_ms":-5}',
        '{"connector":"postgresql","sequence":"[ \\"1\\" , \\"2\\" ]","lsn":3}',
        '{"connector":"postgresql","sequence":"[\\"1.5\\",\\"2\\"]","lsn":3}',
        '{"connector":"postgresql","sequence":"[\\"1\\",\\"2\\",\\"3\\"]","lsn":3}',
        '{"connector":"postgresql","sequence":"not json","lsn":3}',
        '{"connector":"postgresql","sequence":"[\\"99999999999999999999\\",\\"1\\"]","lsn":3}',
        '{"connector":"postgresql","sequence":"[\\"999999999999999999\\",\\"007\\"]","lsn":3}',
        '{"connector":"postgresql","sequence":["1","2"],"lsn":3}',
        '{"connector":"postgresql","lsn":24023128,"ts_ms":1700000000000}',
        '{"connector":"postgresql","sequence":null}',
        '{"connector":"mysql","file":"mysql-bin.000003","pos":154,"row":1,"ts_ms":1700000000000}',
        '{"connector":"mysql","file":"binlog","pos":154}',
        '{"connector":"sqlserver","commit_lsn":"00000025:00000d98:0002","change_lsn":null,"event_serial_no":1}',
        '{"connector":"oracle","scn":"123","commit_scn":"125"}',
        '{"connector":"mongodb","ord":1}',
        '{"ts_ms":253402300800000}',
        '{"ts_ms":-62135596800001}',
        '{"ts_ms":"1700000000000"}',
        '{"lsn":true}',
        "null",
        '"text"',
        "",
    ]
)
HEADERS = st.sampled_from(
    [
        (),
        (("__debezium.oldkey", b'{"id":7}'),),
        (("__debezium.newkey", b'{"schema":{"type":"struct"},"payload":{"id":8}}'),),
        (("__debezium.oldkey", b"not json"),),
        (("other", b"x"), ("__debezium.newkey", None)),
    ]
)


@st.composite
def ingest_envelopes(draw: st.DrawFn) -> tuple[bytes | None, Headers]:
    op = draw(st.sampled_from("crudd"))
    unsent = draw(st.sampled_from([None, "name", "label", "id"]))

    def image(kind: str) -> str:
        fields = [f'"{name}":{draw(NULLABLE[name])}' for name in VALID]
        fields = [field for field in fields if not field.endswith(":")]
        if unsent is not None and draw(st.booleans()):
            fields = [f for f in fields if not f.startswith(f'"{unsent}":')] + [f'"{unsent}":{PLACEHOLDER}']
        return "{" + ",".join(fields) + "}" if draw(st.integers(0, 9)) or kind == "after" else "null"

    parts = {
        "op": f'"{op}"',
        "before": image("before") if op in "ud" else "null",
        "after": image("after") if op != "d" else "null",
        "source": draw(SOURCES),
        "ts_ms": draw(st.sampled_from(["1700000000000", "", "null", "1.5"])),
    }
    text = "{" + ",".join(f'"{k}":{v}' for k, v in parts.items() if v) + "}"
    return text.encode(), draw(HEADERS)


@cache
def ingest_pairs() -> list[Pair]:
    return [
        Pair(WIDE, INGEST_OPTIONS, INGEST_METADATA),
        Pair(WIDE, {"unavailable-values": "report"}, ALL_METADATA),
        Pair(WIDE, {"changelog-mode": "upsert", "unavailable-values": "fail"}, ("source.sequence",)),
    ]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ingest_envelopes(), min_size=1, max_size=6))
def test_metadata_and_upsert_blocks_decode_as_per_record_or_not_at_all(
    messages: list[tuple[bytes | None, Headers]],
) -> None:
    values, headers = [value for value, _ in messages], [h for _, h in messages]
    for pair in ingest_pairs():
        result = pair.check(values, headers)
        event(f"{pair.metadata[:1]} {pair.options}: {'columnar' if result is not None else 'per record'}")


def test_ingest_blocks_with_positions_placeholders_and_key_headers_take_the_columnar_path() -> None:
    pair = Pair(PRODUCTS, INGEST_OPTIONS, INGEST_METADATA)
    postgres = {"connector": "postgresql", "sequence": '["24023128","24023176"]', "lsn": 24023176, "ts_ms": 7}
    mysql = {"connector": "mysql", "file": "mysql-bin.000003", "pos": 154, "row": 2, "ts_ms": 8}
    unsent = {**ROW2, "description": "__debezium_unavailable_value"}
    values = [
        orjson.dumps({"op": "c", "after": ROW, "source": postgres}),
        orjson.dumps({"op": "u", "before": None, "after": unsent, "source": postgres}),
        orjson.dumps({"op": "u", "before": ROW, "after": unsent, "source": mysql}),
        orjson.dumps({"op": "d", "before": {"id": 1}, "source": {**postgres, "sequence": '[null,"5"]'}}),
        orjson.dumps({"op": "c", "after": ROW2, "source": {"connector": "postgresql", "lsn": 9}}),
    ]
    headers: list[Headers] = [(), (), (), (("__debezium.newkey", b'{"id":2}'),), ()]
    result = pair.check(values, headers)
    assert result is not None
    rows = result.rows.to_pylist()
    assert [row["_row_kind"] for row in rows] == ["+I", "+U", "+U", "-D", "+I"]
    assert [row["source_sequence"] for row in rows] == [
        [24023128, 24023176],
        [24023128, 24023176],
        [3, 154, 2],
        [0, 5],
        [9],
    ]
    # Unsent with no before image: NULL and listed; with one, the before image's value.
    assert [row["unavailable_columns"] for row in rows] == [[], ["description"], [], [], []]
    assert [row["description"] for row in rows][1:3] == [None, "small"]
    assert [row["new_key"] for row in rows] == [None, None, None, '{"id":2}', None]


SEQUENCE_TEXT = st.one_of(
    st.from_regex(_QUOTED, fullmatch=True),
    st.text(alphabet='[]",0123456789+- \u0661', max_size=30),
    st.builds(
        lambda a, b: f'["{a}","{b}"]',
        st.text(alphabet="0123456789+- \u0661", max_size=20),
        st.text("0123456789", max_size=20),
    ),
)


@given(st.lists(SEQUENCE_TEXT, min_size=1, max_size=4))
def test_postgres_sequences_are_read_vectorised_exactly_when_every_one_has_the_quoted_form(
    texts: list[str],
) -> None:
    found = _quoted_pairs(pa.array(texts, pa.string()), np.ones(len(texts), dtype=bool))
    quoted = [re.fullmatch(_QUOTED, text) for text in texts]
    event("quoted" if all(quoted) else "other")
    assert (found is not None) == all(quoted)
    if found is not None:
        assert found[1].tolist() == [[int(part) for part in text[2:-2].split('","')] for text in texts]


def test_one_decoder_reads_postgres_then_other_positions_then_postgres_again() -> None:
    """A task's decoder parses PostgreSQL's position fields only until a block has another form; the
    blocks before, the block that has it and the blocks after all decode as per record."""
    pair = Pair(PRODUCTS, INGEST_OPTIONS, INGEST_METADATA)
    postgres = {"connector": "postgresql", "sequence": '["10","20"]', "lsn": 20, "ts_ms": 7}
    mysql = {"connector": "mysql", "file": "mysql-bin.000003", "pos": 154, "row": 2, "ts_ms": 8}
    sqlserver = {"connector": "sqlserver", "commit_lsn": "00000025:00000d98:0002", "event_serial_no": 1}

    def block(*sources: dict[str, Any]) -> list[bytes | None]:
        return [orjson.dumps({"op": "c", "after": ROW, "source": source}) for source in sources]

    # Debezium before 1.4: no sequence, the lsn alone (not parsed while every event has a sequence).
    lsn_only = {"connector": "postgresql", "lsn": 30, "ts_ms": 9}
    sequences = []
    for sources in (
        (postgres, postgres),
        (postgres, lsn_only),
        (postgres, mysql),
        (postgres,),
        (sqlserver, postgres),
    ):
        result = pair.check(block(*sources), fresh=False)
        assert result is not None
        sequences.append(result.rows.column("source_sequence").to_pylist())
    assert sequences == [
        [[10, 20], [10, 20]],
        [[10, 20], [30]],
        [[10, 20], [3, 154, 2]],
        [[10, 20]],
        [[37, 3480, 2, 0, 0, 0, 1], [10, 20]],  # commit_lsn, change_lsn (null: 0s), event_serial_no
    ]


def test_real_postgres_events_with_the_ingest_configuration_decode_as_per_record() -> None:
    pair = Pair(POSTGRES_COLUMNS, INGEST_OPTIONS, INGEST_METADATA)
    retract = Pair(POSTGRES_COLUMNS, {"unavailable-values": "report"}, INGEST_METADATA)
    columnar = 0
    for table in ("cdc_types", "cdc_types_full"):
        values = [value for _, value in _recorded_postgres()[table]]
        for each in (pair, retract):
            each.check(values)
        for value in values:
            columnar += pair.check([value]) is not None
            retract.check([value])
    # Only the truncate and the NaN/Infinity strings go per record now: placeholders are columnar.
    assert columnar >= 12


def test_the_spark_decoder_counts_unavailable_values_as_the_per_record_decoder() -> None:
    """``cdcflow ingest``'s configuration on the recorded PostgreSQL events, a message per block: the
    events with unchanged-TOAST placeholders go columnar, and the values left NULL or taken from the
    before image are counted as the per-record decoder counts them."""
    raw = {
        "kafka.bootstrap.servers": "unused:9092",
        "subscribe": "t",
        "columns": POSTGRES_COLUMNS,
        "metadata": ",".join(INGEST_METADATA),
        **{f"debezium-json.{key}": value for key, value in INGEST_OPTIONS.items()},
    }
    plan = plan_read("debezium-json", raw, None)
    per_record = pickle.loads(pickle.dumps(plan.decoder))
    recorded = _recorded_postgres()
    messages = [
        Message(value, key, "t", 0, offset)
        for offset, (key, value) in enumerate([*recorded["cdc_types"], *recorded["cdc_types_full"]])
    ]
    decoding = BatchDecoder(plan)
    for message in messages:
        list(decoding.batches([message]))
    expected = per_record.decode_all(messages).metrics
    assert expected.unavailable_values > 0
    assert decoding.metrics == expected
