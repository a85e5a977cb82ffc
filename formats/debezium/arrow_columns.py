"""The columns of the columnar Debezium JSON path: the data columns' conversions, each the vectorised
twin of one converter in :mod:`cdcflow.formats.json_decode` for the JSON values Arrow's reader accepts
for the column, and the metadata columns.

A conversion returns None wherever the per-record converter would give anything else (another
value or an error): the caller then decodes the block message by message.

The metadata columns are each the vectorised twin of
:func:`cdcflow.formats.debezium.envelope.metadata_values` for one key. Arrow's JSON reader parses the
``source`` fields the keys read with fixed types (a value of another type fails the block, which then
goes message by message). PostgreSQL's ``source.sequence`` is computed vectorised; any other position
(another connector, an unusual ``sequence`` text) goes through
:func:`~cdcflow.formats.debezium.position.source_sequence` itself, row by row. A value the per-record
path refuses (a timestamp beyond the TIMESTAMP range, a position beyond BIGINT, a malformed key
header) makes the block decline (None).
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.formats.base import Headers
from cdcflow.formats.debezium.envelope import KEY_HEADERS, METADATA, PLACEHOLDER, header_key, is_unavailable
from cdcflow.formats.debezium.position import POSTGRES_SEQUENCE, source_sequence
from cdcflow.formats.errors import FieldError
from cdcflow.formats.temporal import units_per_second
from cdcflow.formats.types import Field, TypeKind

_INTEGER_TYPES = {
    TypeKind.TINYINT: pa.int8(),
    TypeKind.SMALLINT: pa.int16(),
    TypeKind.INT: pa.int32(),
    TypeKind.BIGINT: pa.int64(),
}
#: What Spark's Arrow schema has for each type (``to_arrow_schema``); TIMESTAMP_LTZ has the session zone.
_SPARK_ARROW_TYPES = {
    **_INTEGER_TYPES,
    TypeKind.BOOLEAN: pa.bool_(),
    TypeKind.DOUBLE: pa.float64(),
    TypeKind.FLOAT: pa.float32(),
    TypeKind.STRING: pa.string(),
    TypeKind.DATE: pa.date32(),
    TypeKind.TIMESTAMP_NTZ: pa.timestamp("us"),
    TypeKind.TIME: pa.time64("ns"),
}
#: The type Arrow's JSON reader parses each column as, before the checked conversion.
_PARSED_AS = {
    **dict.fromkeys(_INTEGER_TYPES, pa.int64()),
    TypeKind.DATE: pa.int64(),
    TypeKind.TIMESTAMP_LTZ: pa.int64(),
    TypeKind.TIMESTAMP_NTZ: pa.int64(),
    TypeKind.TIME: pa.int64(),
    TypeKind.BOOLEAN: pa.bool_(),
    TypeKind.FLOAT: pa.float64(),
    TypeKind.DOUBLE: pa.float64(),
    TypeKind.STRING: pa.string(),
}

_EPOCH = dt.datetime(1970, 1, 1)
_MICROS = dt.timedelta(microseconds=1)
#: Python's datetime range, which bounds what the per-record path accepts, in microseconds since the epoch.
_MIN_MICROS = (dt.datetime.min - _EPOCH) // _MICROS
_MAX_MICROS = (dt.datetime.max - _EPOCH) // _MICROS
_MIN_DAYS = (dt.date.min - _EPOCH.date()).days
_MAX_DAYS = (dt.date.max - _EPOCH.date()).days
_MICROS_PER_DAY = 86_400_000_000

Int64s = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]


@functools.cache
def placeholder_texts() -> pa.Array:
    """The text forms of Debezium's unchanged-TOAST placeholder (as is, and base64 for bytes columns).

    Built on first use: a first ``pa.array`` of Python values imports pandas (0.2 s), which the
    process planning a stream's offsets never needs."""
    texts = [PLACEHOLDER, base64.b64encode(PLACEHOLDER.encode()).decode()]
    assert all(is_unavailable(text) for text in texts)  # noqa: S101 - the per-record path's own test
    return pa.array(texts, pa.string())


@dataclass(frozen=True)
class ColumnPlan:
    """How one declared column is read: the type Arrow's JSON reader parses it as, and the target."""

    name: str
    kind: TypeKind
    precision: int | None
    nullable: bool
    target: pa.DataType

    @property
    def parsed_as(self) -> pa.DataType:
        return _PARSED_AS[self.kind]

    def convert(self, parsed: pa.Array) -> pa.Array | None:
        """The column's values as ``target``, or None where the per-record path would differ."""
        kind = self.kind
        if kind in _INTEGER_TYPES:
            return _integers(parsed, self.target)
        if kind is TypeKind.BOOLEAN:
            return parsed
        if kind is TypeKind.STRING:
            return None if pc.any(pc.is_in(parsed, value_set=placeholder_texts())).as_py() else parsed
        if kind in (TypeKind.FLOAT, TypeKind.DOUBLE):
            return _floats(parsed, single=kind is TypeKind.FLOAT)
        values, valid = _int64_values(parsed)
        if kind is TypeKind.DATE:
            if not _within(values, valid, _MIN_DAYS, _MAX_DAYS):
                return None
            return pa.array(values.astype(np.int32), pa.int32(), mask=~valid).view(self.target)
        micros = _micros(values, valid, self.precision)
        if micros is None:
            return None
        if kind is TypeKind.TIME:
            if not _within(micros, valid, 0, _MICROS_PER_DAY - 1):
                return None
            return pa.array(micros * 1000, pa.int64(), mask=~valid).view(self.target)
        if not _within(micros, valid, _MIN_MICROS, _MAX_MICROS):
            return None
        return pa.array(micros, pa.int64(), mask=~valid).view(self.target)


def plan_column(column: Field, arrow_field: pa.Field, *, relaxed: bool = False) -> ColumnPlan | None:
    """The plan of a declared column whose Spark-side Arrow field is ``arrow_field``; None if the
    columnar path does not read this type, or the Arrow field is not the one Spark expects for it.
    ``relaxed``: a NOT NULL column may be nullable in the output (an unsent value is NULL there)."""
    expected = _expected_arrow_type(column, arrow_field.type)
    nullable_ok = arrow_field.nullable == column.nullable or (relaxed and arrow_field.nullable)
    if expected is None or arrow_field.name != column.name or not nullable_ok:
        return None
    if arrow_field.type != expected:
        return None
    return ColumnPlan(column.name, column.type.kind, column.type.precision, column.nullable, expected)


def _expected_arrow_type(column: Field, given: pa.DataType) -> pa.DataType | None:
    kind = column.type.kind
    if kind in _SPARK_ARROW_TYPES:
        return _SPARK_ARROW_TYPES[kind]
    if kind is TypeKind.TIMESTAMP_LTZ and pa.types.is_timestamp(given) and given.tz is not None:
        # An instant: the values are UTC microseconds whatever zone name the session gives Arrow.
        return pa.timestamp("us", tz=given.tz)
    return None


def _integers(parsed: pa.Array, target: pa.DataType) -> pa.Array | None:
    if target == parsed.type:
        return parsed
    try:
        return pc.cast(parsed, target)  # a checked cast: an out-of-range value fails, never wraps
    except pa.ArrowInvalid:
        return None


def _floats(parsed: pa.Array, *, single: bool) -> pa.Array | None:
    values = parsed.to_numpy(zero_copy_only=False)
    valid = validity(parsed)
    with np.errstate(invalid="ignore"):
        # A JSON number never reads as NaN or an infinity per record (those arrive as strings, which
        # Arrow rejects for a number column): here they can only come from NaN/Infinity literals or
        # numbers beyond the double range, which the per-record parser refuses. A negative zero may
        # be the integer -0, which the per-record path reads as +0.0.
        odd = ~np.isfinite(values) | ((values == 0) & np.signbit(values))
    if np.any(odd & valid):
        return None
    if not single:
        return parsed
    with np.errstate(over="ignore"):
        narrowed = values.astype(np.float32)
    if np.any(np.isinf(narrowed) & valid):
        return None  # beyond FLOAT's range: the per-record path fails the record
    return pa.array(narrowed, pa.float32(), mask=~valid)


def validity(parsed: pa.Array) -> Mask:
    """Where ``parsed`` is not null, as a numpy mask."""
    if parsed.null_count == 0:
        return np.ones(len(parsed), dtype=np.bool_)
    return parsed.is_valid().to_numpy(zero_copy_only=False)  # type: ignore[no-any-return]


def _int64_values(parsed: pa.Array) -> tuple[Int64s, Mask]:
    values = parsed.fill_null(0).to_numpy(zero_copy_only=False)
    return values.astype(np.int64, copy=False), validity(parsed)


def _within(values: Int64s, valid: Mask, low: int, high: int) -> bool:
    inside = (values >= low) & (values <= high)
    return bool(np.all(inside | ~valid))


def _micros(values: Int64s, valid: Mask, precision: int | None) -> Int64s | None:
    """Epoch (or since-midnight) integers in the unit the precision implies, as microseconds (floored)."""
    per_second = units_per_second(precision)
    if per_second == 1_000_000:
        return values
    if per_second == 1_000_000_000:
        return np.floor_divide(values, 1000)
    # Milliseconds: beyond the datetime range the product could overflow, and the record fails anyway.
    if not _within(values, valid, _MIN_MICROS // 1000, _MAX_MICROS // 1000):
        return None
    return values * 1000


#: The metadata keys the columnar path computes.
SUPPORTED = frozenset(column.key for column in METADATA if column.columnar)
#: The ``source`` fields :func:`source_sequence` reads, as Arrow's reader parses them.
_POSITION_FIELDS = (
    ("connector", pa.string()),
    ("sequence", pa.string()),
    ("lsn", pa.int64()),
    ("file", pa.string()),
    ("pos", pa.int64()),
    ("row", pa.int64()),
    ("commit_lsn", pa.string()),
    ("change_lsn", pa.string()),
    ("event_serial_no", pa.int64()),
    ("scn", pa.string()),
    ("commit_scn", pa.string()),
)
#: What a block of PostgreSQL's positions is parsed for: its ``lsn`` is read only where ``sequence`` is
#: missing (Debezium before 1.4), and such a block is parsed again with every position field.
_POSTGRES_PARSED = ("connector", "sequence")
#: Epoch milliseconds within Python's datetime range (years 1 to 9999), as ``_millis`` accepts them.
_MIN_MILLIS, _MAX_MILLIS = -62_135_596_800_000, 253_402_300_799_999


class PositionFieldsNeeded(Exception):
    """A block parsed with PostgreSQL's position fields only has a position of another form."""


def envelope_fields(metadata: Sequence[str], *, postgres: bool = False) -> list[pa.Field]:
    """The envelope fields (besides op, before, after) Arrow's reader must parse for ``metadata``;
    ``postgres``: of the position, the fields PostgreSQL's take only."""
    source: dict[str, pa.DataType] = {}
    if "source.sequence" in metadata:
        # PostgreSQL's fields alone: the others cost the parser a sixth of its time.
        source.update(f for f in _POSITION_FIELDS if not postgres or f[0] in _POSTGRES_PARSED)
    if "source.lsn" in metadata:
        source["lsn"] = pa.int64()
    if "source.timestamp" in metadata:
        source["ts_ms"] = pa.int64()
    fields = [pa.field("source", pa.struct(list(source.items())))] if source else []
    if "ingestion-timestamp" in metadata:
        fields.append(pa.field("ts_ms", pa.int64()))
    return fields


def metadata_columns(
    metadata: Sequence[str],
    types: Sequence[pa.DataType],
    parsed: pa.RecordBatch,
    unavailable: pa.Array | None,
    headers: Sequence[Headers] | None,
    *,
    postgres: bool = False,
) -> list[pa.Array] | None:
    """One array per message for each key of ``metadata`` (of the matching type), or None to decline.

    ``unavailable`` is each message's list of columns Debezium did not send; ``headers`` the messages'
    Kafka headers (None: they have none). ``postgres``: ``parsed`` has PostgreSQL's position fields
    only (:func:`envelope_fields`), and a position of another form raises :class:`PositionFieldsNeeded`.
    """
    names = parsed.schema.names
    source = parsed.column(names.index("source")) if "source" in names else None
    out: list[pa.Array] = []
    for key, arrow_type in zip(metadata, types, strict=True):
        value: pa.Array | None
        if key == "source.sequence":
            assert source is not None  # noqa: S101 - envelope_fields parses it
            value = _sequence(source, postgres_fields=postgres)
        elif key == "source.timestamp":
            assert source is not None  # noqa: S101
            value = _millis(_field(source, "ts_ms"), arrow_type)
        elif key == "ingestion-timestamp":
            value = _millis(parsed.column(names.index("ts_ms")), arrow_type)
        elif key == "source.lsn":
            assert source is not None  # noqa: S101
            value = _field(source, "lsn")
        elif key == "unavailable-columns":
            assert unavailable is not None  # noqa: S101 - the caller computes it when asked
            value = unavailable
        else:
            value = _header_keys(headers, KEY_HEADERS[key], parsed.num_rows)
        if value is None:
            return None
        out.append(value.cast(arrow_type) if value.type != arrow_type else value)
    return out


def _field(struct: pa.StructArray, name: str) -> pa.Array:
    """A field of the ``source`` struct, null where the struct is null (a missing or null block)."""
    values = struct.field(name)
    return values if struct.null_count == 0 else pc.if_else(struct.is_valid(), values, None)


def _millis(values: pa.Array, arrow_type: pa.DataType) -> pa.Array | None:
    if values.null_count == len(values):
        return pa.nulls(len(values), arrow_type)
    low, high = pc.min_max(values).values()
    if low.as_py() < _MIN_MILLIS or high.as_py() > _MAX_MILLIS:
        return None  # the record fails per record
    micros = pc.multiply(values, 1000)
    return micros.cast(pa.timestamp("us", tz="UTC")).cast(arrow_type)


def _sequence(source: pa.StructArray, *, postgres_fields: bool = False) -> pa.Array | None:
    """``source_sequence`` of every message: PostgreSQL's usual forms vectorised, the rest by it."""
    count = len(source)
    connector = _field(source, "connector")
    postgres = pc.fill_null(pc.equal(connector, "postgresql"), False).to_numpy(zero_copy_only=False)
    text = _field(source, "sequence")
    quoted = _quoted_pairs(text, postgres)
    if quoted is not None:
        pair, values = quoted
    else:
        matched = pc.extract_regex(pc.fill_null(text, ""), POSTGRES_SEQUENCE.pattern)
        pair = postgres & matched.is_valid().to_numpy(zero_copy_only=False)
        values = np.zeros((count, 2), dtype=np.int64)
        if pair.any():
            values[:, 0] = _parts(matched.field("a"), pair)
            values[:, 1] = _parts(matched.field("b"), pair)
    by_lsn = postgres & text.is_null().to_numpy(zero_copy_only=False)
    if by_lsn.any() and source.type.get_field_index("lsn") < 0:
        raise PositionFieldsNeeded
    lsn = _field(source, "lsn") if by_lsn.any() else pa.nulls(count, pa.int64())
    has_lsn = lsn.is_valid().to_numpy(zero_copy_only=False)
    lengths = np.where(pair, 2, np.where(by_lsn & has_lsn, 1, 0)).astype(np.int64)
    valid = pair | (by_lsn & has_lsn)
    if (by_lsn & has_lsn).any():
        values[:, 0] = np.where(by_lsn, lsn.fill_null(0).to_numpy(zero_copy_only=False), values[:, 0])
    rest = np.flatnonzero(~(pair | by_lsn))
    sequences: dict[int, list[int] | None] = {}
    if len(rest) and postgres_fields:
        raise PositionFieldsNeeded
    if len(rest):
        rows = source.take(pa.array(rest)).to_pylist()
        for index, row in zip(rest.tolist(), rows, strict=True):
            try:
                sequences[int(index)] = source_sequence(row) if row is not None else None
            except FieldError:
                return None  # beyond BIGINT: the per-record path fails the record
    if not sequences:
        slots = np.arange(2)[None, :] < lengths[:, None]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        return pa.ListArray.from_arrays(
            pa.array(offsets), pa.array(values[slots], pa.int64()), mask=pa.array(~valid)
        )
    listed: list[list[int] | None] = []
    for index in range(count):
        if index in sequences:
            listed.append(sequences[index])
        elif valid[index]:
            listed.append(values[index, : lengths[index]].tolist())
        else:
            listed.append(None)
    return pa.array(listed, pa.list_(pa.int64()))


_QUOTED = r'^\["[0-9]{1,18}","[0-9]{1,18}"\]$'
"""The sequence as Debezium's PostgreSQL connector usually writes it: both positions quoted."""


def _quoted_pairs(
    text: pa.Array, postgres: npt.NDArray[np.bool_]
) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.int64]] | None:
    """Where PostgreSQL's sequences are, and their two positions, when every one has the quoted form
    (:data:`_QUOTED`, a case of :data:`POSTGRES_SEQUENCE`, matched without extracting); None otherwise."""
    pair = postgres & text.is_valid().to_numpy(zero_copy_only=False)
    values = np.zeros((len(text), 2), dtype=np.int64)
    if not pair.any():
        return pair, values
    texts = text.filter(pa.array(pair))
    # _QUOTED without RE2 (its byte-by-byte match was the most of this): framed by [" and "], two
    # parts between them, each of 1 to 18 ASCII digits.
    if not pc.all(pc.and_(pc.starts_with(texts, '["'), pc.ends_with(texts, '"]'))).as_py():
        return None
    inner = pc.binary_slice(texts.cast(pa.binary()), 2, -2).cast(pa.string())  # cut at ASCII bytes
    parts = pc.split_pattern(inner, '","')
    if not pc.all(pc.equal(pc.list_value_length(parts), 2)).as_py():
        return None
    digits = pc.list_flatten(parts)
    if not pc.all(pc.and_(pc.ascii_is_decimal(digits), pc.less_equal(pc.binary_length(digits), 18))).as_py():
        return None
    values[pair] = np.asarray(pc.cast(digits, pa.int64())).reshape(-1, 2)
    return pair, values


def _parts(part: pa.Array, matched: npt.NDArray[np.bool_]) -> npt.NDArray[np.int64]:
    """One part of a PostgreSQL sequence (``"123"``, ``123`` or ``null`` = 0) as integers, where the
    sequence ``matched`` (0 elsewhere)."""
    digits = pc.replace_substring(part, '"', "")
    usable = pc.and_(pa.array(matched), pc.not_equal(digits, "null"))
    numbers = pc.if_else(usable, digits, "0")
    return pc.cast(numbers, pa.int64()).to_numpy(zero_copy_only=False)  # type: ignore[no-any-return]


def _header_keys(headers: Sequence[Headers] | None, name: str, count: int) -> pa.Array | None:
    if headers is None or not any(headers):
        return pa.nulls(count, pa.string())
    keys: list[str | None] = []
    for message_headers in headers:
        try:
            keys.append(header_key(message_headers, name) if message_headers else None)
        except FieldError:
            return None
    return pa.array(keys, pa.string())


def unavailable_lists(missing: npt.NDArray[np.bool_], names: Sequence[str]) -> pa.Array:
    """Per message (a row of ``missing``, a column per name): the names of its True columns, in order."""
    count = missing.shape[0]
    if not missing.any():
        return pa.ListArray.from_arrays(
            pa.array(np.zeros(count + 1, dtype=np.int32)), pa.array([], pa.string())
        )
    rows, columns = np.nonzero(missing)  # row-major: each row's columns in order
    offsets = np.concatenate([[0], np.cumsum(missing.sum(axis=1))]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(names, pa.string()).take(pa.array(columns)))
