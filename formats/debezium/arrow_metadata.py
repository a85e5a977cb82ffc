"""The Debezium metadata columns of the columnar path, each the vectorised twin of
:func:`cdcflow.formats.debezium.envelope.metadata_values` for one key.

Arrow's JSON reader parses the ``source`` fields the keys read with fixed types (a value of another
type fails the block, which then goes message by message). PostgreSQL's ``source.sequence`` is
computed vectorised; any other position (another connector, an unusual ``sequence`` text) goes through
:func:`~cdcflow.formats.debezium.position.source_sequence` itself, row by row. A value the per-record
path refuses (a timestamp beyond the TIMESTAMP range, a position beyond BIGINT, a malformed key
header) makes the block decline (None).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.formats.base import Headers
from cdcflow.formats.debezium.envelope import KEY_HEADERS, METADATA, header_key
from cdcflow.formats.debezium.position import POSTGRES_FIELDS, POSTGRES_SEQUENCE, source_sequence
from cdcflow.formats.errors import FieldError

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
        source.update(f for f in _POSITION_FIELDS if not postgres or f[0] in POSTGRES_FIELDS)
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
    lsn = _field(source, "lsn")
    matched = pc.extract_regex(pc.fill_null(text, ""), POSTGRES_SEQUENCE.pattern)
    pair = postgres & matched.is_valid().to_numpy(zero_copy_only=False)
    by_lsn = postgres & text.is_null().to_numpy(zero_copy_only=False)
    has_lsn = lsn.is_valid().to_numpy(zero_copy_only=False)
    lengths = np.where(pair, 2, np.where(by_lsn & has_lsn, 1, 0)).astype(np.int64)
    valid = pair | (by_lsn & has_lsn)
    values = np.zeros((count, 2), dtype=np.int64)
    if pair.any():
        values[:, 0] = _parts(matched.field("a"), pair)
        values[:, 1] = _parts(matched.field("b"), pair)
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


def _parts(part: pa.Array, matched: npt.NDArray[np.bool_]) -> npt.NDArray[np.int64]:
    """One part of a PostgreSQL sequence (``"123"``, ``123`` or ``null`` = 0) as integers, where the
    sequence ``matched`` (0 elsewhere)."""
    digits = pc.replace_substring(part, '"', "")
    usable = pc.and_(pa.array(matched), pc.not_equal(digits, "null"))
    numbers = pc.if_else(usable, digits, "0")
    return pc.cast(numbers, pa.int64()).to_numpy(zero_copy_only=False)  # type: ignore[no-any-return]


def _header_keys(headers: Sequence[Headers] | None, name: str, count: int) -> pa.Array | None:
    if headers is None:
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
