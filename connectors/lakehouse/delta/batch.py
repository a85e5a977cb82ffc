"""One micro-batch of a changelog as Arrow columns: checked, numbered, sequenced, its control events
split off, reduced per key.

A row whose control column is set is an event about the table (TRUNCATE, messages, schema changes), not
a change of a row: its row kind and data columns are null. A ``truncate`` empties the table at its
position in the batch (by sequence when the batch has one, else by arrival): the batch's changes before
it are void, the ones after it apply to the empty table. Every other control event is counted and
skipped (:func:`split_controls`, :func:`decide`).

Sequence values become sortable bytes (:func:`sortable`), so one comparison orders any ``sequence_by``
column: integers, floats, dates, timestamps, strings, binaries and arrays of integers (Debezium's
``source.sequence``) all map to bytes whose lexicographic order is the values' order; an array compares
like a tuple. Nulls stay null: the applier dead-letters a change without a sequence, or
(``unsequenced='arrival'``) places it where it arrived, never as late.

Rows are matched by key within a batch (:func:`group_ids`: which rows share a key) and against the key
state (:func:`positions_in`): a single key column with a hash lookup (``dictionary_encode``,
``index_in``), a composite key with one Arrow join. Keys are never null here (:func:`prepare` refuses
null keys).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.connectors.errors import ChangelogConsistencyError, ConnectorOptionError
from cdcflow.connectors.lakehouse.delta.merge import OP
from cdcflow.connectors.lakehouse.delta.tables import TableHandle
from cdcflow.formats.base import METADATA_MARK

log = logging.getLogger(__name__)

ROW_KINDS = ("+I", "-U", "+U", "-D")
_ROW_KINDS = pa.array(ROW_KINDS)
_KIND_TEXTS = np.array(ROW_KINDS, dtype="U2")
"""A batch's row kinds as numpy text (vectorised comparisons; an object array compares one by one)."""
INTERNAL = "_cdcflow_"
"""The prefix of the columns the applier adds to a batch (never written to the table)."""
IDX, SEQ = "_cdcflow_idx", "_cdcflow_seq"
EPOCH = "_cdcflow_epoch"
"""Optional: how many restarts of the log position precede a change of its key (see ``sequence_order``)."""
ORDER = "_cdcflow_order"
"""Optional: the sequence a change sorts by when it has none of its own (see ``arrival_order``)."""
_COORDINATES = (("topic", "partition", "offset"), ("file", "line"))
_SPARK_FIELD_METADATA = b"SPARK::metadata::json"
"""Where pyspark's ``toArrow`` keeps a Spark field's metadata (JSON) in the Arrow field's metadata."""


@dataclass(frozen=True)
class ChangeBatch:
    """The changes of one batch: data columns plus ``_cdcflow_idx`` (arrival), ``_cdcflow_seq``, kinds."""

    data: pa.Table
    kinds: np.ndarray
    origin: pa.Table
    batch_id: int
    restart: pa.Array | None = None
    """``restart_by`` as sortable bytes, one per arrival position (None without restart_by)."""
    extra: pa.Table = field(default_factory=lambda: pa.table({}))
    """Per-change columns kept out of the table that the applier reads (unavailable columns, PK links)."""
    event_columns: tuple[str, ...] = ()
    """Data columns that describe the change, not the row: the metadata columns a source marked (where
    and when the change happened, its envelope) and the ``sequence_by`` / ``restart_by`` columns. A
    retraction's values in them are its own, never the added row's, so they never decide a match."""

    @property
    def num_rows(self) -> int:
        return int(self.data.num_rows)

    def where(self, index: int) -> str:
        """Where row ``index`` came from (topic/partition@offset or file:line when the batch has them)."""
        return describe(self.origin, index, index, self.batch_id)

    def keep(self, mask: np.ndarray) -> ChangeBatch:
        """The changes where ``mask`` is true, renumbered (``_cdcflow_idx`` stays the position)."""
        take = pa.array(np.flatnonzero(mask))
        data = self.data.take(take)
        data = data.set_column(
            data.schema.get_field_index(IDX), IDX, pa.array(np.arange(data.num_rows, dtype=np.int64))
        )
        return ChangeBatch(
            data,
            self.kinds[np.asarray(mask, dtype=bool)],
            self.origin.take(take),
            self.batch_id,
            self.restart.take(take) if self.restart is not None else None,
            self.extra.take(take),
            self.event_columns,
        )


def coordinates(table: pa.Table) -> pa.Table:
    """The columns of ``table`` that say where a row came from."""
    names = {c for group in _COORDINATES for c in group}
    return table.select([n for n in table.schema.names if n in names])


def describe(origin: pa.Table, index: int, arrival: int, batch_id: int) -> str:
    """Row ``index`` of ``origin`` as topic/partition@offset or file:line, else its arrival position."""
    for names in _COORDINATES:
        if all(name in origin.schema.names for name in names):
            values = [origin.column(name)[index].as_py() for name in names]
            return f"{values[0]}/{values[1]}@{values[2]}" if len(values) == 3 else f"{values[0]}:{values[1]}"
    return f"row {arrival} of batch {batch_id}"


def prepare(
    table: pa.Table,
    batch_id: int,
    key: Sequence[str],
    row_kind_column: str,
    sequence_by: str | None,
    exclude: Sequence[str],
    restart_by: str | None = None,
    extra: Sequence[str] = (),
) -> ChangeBatch:
    """``table``'s changes, checked; ``extra`` names columns kept aside (see ``ChangeBatch.extra``)."""
    names = table.schema.names
    ordering = [c for c in (sequence_by, restart_by) if c]
    for column in (*key, row_kind_column, *ordering):
        if column not in names:
            raise ChangelogConsistencyError(
                f"batch {batch_id} has no column {column!r} (columns: {', '.join(names)}); the key, the "
                "row kind column, sequence_by and restart_by must name columns of the changelog"
            )
    column = table.column(row_kind_column)
    origin = coordinates(table)
    textual = (pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view)
    codes = (
        pc.index_in(column.cast(pa.string()), value_set=_ROW_KINDS)
        if any(kind(column.type) for kind in textual)
        else pa.nulls(len(column), pa.int32())
    )
    if codes.null_count:
        at = int(np.argmax(np.asarray(pc.is_null(codes), dtype=bool)))
        raise ChangelogConsistencyError(
            f"{describe(origin, at, at, batch_id)}: row kind {column[at].as_py()!r} is not one of "
            f"{', '.join(ROW_KINDS)}"
        )
    kinds = _KIND_TEXTS[np.asarray(codes, dtype=np.int64)]
    batch = ChangeBatch(table, kinds, origin, batch_id)
    for column in key:
        nulls = table.column(column).is_null()
        if pc.any(nulls).as_py():
            at = int(np.argmax(np.asarray(nulls)))
            raise ChangelogConsistencyError(
                f"{batch.where(at)}: key column {column!r} is null; a Delta table keyed by "
                f"{', '.join(key)} cannot hold it (fix the key, or filter such rows into a dead-letter table)"
            )
    aside = [c for c in extra if c in names]
    data = table.drop_columns([c for c in {row_kind_column, *exclude, *aside} if c in names and c not in key])
    events = tuple(c for c in (*marked_columns(data.schema), *ordering) if c in data.schema.names)
    # Spark's field metadata (the marks) stays out of the key state's schema.
    data = pa.Table.from_arrays(data.columns, schema=pa.schema([f.remove_metadata() for f in data.schema]))
    data = data.append_column(IDX, pa.array(np.arange(table.num_rows, dtype=np.int64)))
    if sequence_by:
        data = data.append_column(SEQ, sortable(table.column(sequence_by), sequence_by))
    restart = sortable(table.column(restart_by), restart_by) if sequence_by and restart_by else None
    return ChangeBatch(
        data, kinds, origin, batch_id, restart, table.select(aside), tuple(dict.fromkeys(events))
    )


def marked_columns(schema: pa.Schema) -> list[str]:
    """The columns a cdcflow source marked as metadata (:data:`cdcflow.formats.base.METADATA_MARK`)."""
    marked = []
    for column in schema:
        spark = (column.metadata or {}).get(_SPARK_FIELD_METADATA)
        try:
            if spark is not None and METADATA_MARK in json.loads(spark):
                marked.append(column.name)
        except (ValueError, TypeError):  # not Spark's JSON object: not marked
            continue
    return marked


def arrival_order(batch: ChangeBatch, key: Sequence[str]) -> ChangeBatch:
    """``batch`` with a change without a sequence sorted by the highest sequence of its key's changes
    that arrived before it in the batch (``_cdcflow_order``), so that it applies after them; one with
    none before it sorts first. Its own sequence stays null: it is never late."""

    seq = batch.data.column(SEQ).combine_chunks()
    missing = np.asarray(pc.is_null(seq), dtype=bool)
    if missing.all() or not missing.any():
        return batch
    kid = group_ids(batch.data, key)
    mixed = np.intersect1d(kid[missing], kid[~missing])
    values = seq.to_pylist()
    highest: dict[int, bytes] = {}
    for at in np.flatnonzero(np.isin(kid, mixed)).tolist():  # rows are in arrival order
        k, value = int(kid[at]), values[at]
        if value is None:
            values[at] = highest.get(k)
        elif k not in highest or value > highest[k]:
            highest[k] = value
    return dataclasses.replace(
        batch, data=batch.data.append_column(ORDER, pa.array(values, pa.large_binary()))
    )


def check_update_pairs(batch: ChangeBatch, key: Sequence[str]) -> None:
    """Each -U is directly followed by the +U of the same key (what an ordered upsert changelog is)."""
    before = np.flatnonzero(batch.kinds == "-U")
    if len(before) == 0:
        return
    n = batch.num_rows
    following = before + 1
    ok = following < n
    ok[ok] &= batch.kinds[following[ok]] == "+U"
    for column in key:
        values = batch.data.column(column)
        valid = np.flatnonzero(ok)
        if len(valid):
            same = pc.equal(values.take(before[valid]), values.take(following[valid]))
            ok[valid] &= np.asarray(same.to_numpy(zero_copy_only=False), dtype=bool)
    if not ok.all():
        at = int(before[np.argmax(~ok)])
        raise ChangelogConsistencyError(
            f"{batch.where(at)}: a -U is not followed by the +U of the same key, so the changelog is not "
            "ordered per primary key (a shuffle or a join reordered it); apply it with materialize='force', "
            "which keeps the live rows per key in state"
        )


def last_per_key(batch: ChangeBatch, key: Sequence[str]) -> pa.Table:
    """The last +I/+U/-D of each key (by sequence, then arrival), with ``_cdcflow_op`` U (upsert) or D."""

    names = batch.data.schema.names
    keep = np.flatnonzero(batch.kinds != "-U")
    # Ordered on the key and ordering columns; the whole rows are taken once, for the winners.
    narrow = batch.data.select([*key, *(c for c in (SEQ, ORDER, IDX, EPOCH) if c in names)]).take(
        pa.array(keep)
    )
    if SEQ in names:
        order = np.asarray(sequence_order(narrow), dtype=np.int64)
        narrow, keep = narrow.take(pa.array(order)), keep[order]
    ids = group_ids(narrow, key)
    last = np.full(int(ids.max()) + 1 if len(ids) else 0, -1, dtype=np.int64)
    np.maximum.at(last, ids, np.arange(len(ids), dtype=np.int64))  # each key's last position
    picked = keep[np.sort(last[last >= 0])]
    rows = batch.data.take(pa.array(picked))
    return rows.append_column(OP, pc.if_else(pa.array(batch.kinds[picked] == "-D"), "D", "U"))


def sequence_order(rows: pa.Table) -> pa.Array:
    """Row positions by epoch (restarts of the key's log position, when known), sequence, then arrival;
    a change without a sequence sorts first in its epoch (unless ``arrival_order`` placed it)."""
    ordered = rows.column(ORDER if ORDER in rows.schema.names else SEQ)
    keys = pa.table({"seq": pc.fill_null(ordered, b""), "idx": rows.column(IDX)})
    order = [("seq", "ascending"), ("idx", "ascending")]
    if EPOCH in rows.schema.names:
        keys = keys.append_column("epoch", rows.column(EPOCH))
        order.insert(0, ("epoch", "ascending"))
    return pc.sort_indices(keys, order)


_SIGN = np.uint64(1 << 63)


def sortable(values: pa.ChunkedArray | pa.Array, column: str) -> pa.Array:
    """The values of ``column`` as binary keys in the same order; nulls kept."""
    array = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    kind = array.type
    if pa.types.is_integer(kind) or pa.types.is_temporal(kind) or pa.types.is_boolean(kind):
        return _fixed(_int64(array), array)
    if pa.types.is_floating(kind):
        return _fixed(_float_bits(array), array)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return pc.cast(array.cast(pa.large_string()), pa.large_binary())
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return array.cast(pa.large_binary())
    if (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and pa.types.is_integer(kind.value_type):
        return _int_lists(array)
    raise ConnectorOptionError(
        f"sequence_by column {column!r} is {kind}; use an integer, floating point, date, timestamp, "
        "string or ARRAY<BIGINT> column"
    )


def _int64(array: pa.Array) -> np.ndarray:
    if pa.types.is_boolean(array.type):
        array = array.cast(pa.int8())
    elif pa.types.is_temporal(array.type):
        array = array.cast(pa.int64()) if not pa.types.is_date32(array.type) else array.cast(pa.int32())
    return np.asarray(array.cast(pa.int64()).fill_null(0), dtype=np.int64)


def _float_bits(array: pa.Array) -> np.ndarray:
    bits = np.asarray(array.cast(pa.float64()).fill_null(0.0), dtype=np.float64).view(np.uint64)
    negative = (bits & _SIGN) != 0
    # IEEE 754 order: flip every bit of negatives, only the sign bit of positives; then undo the
    # sign flip _fixed applies to integers.
    flipped = np.where(negative, ~bits, bits | _SIGN)
    return (flipped ^ _SIGN).view(np.int64)


def _fixed(numbers: np.ndarray, array: pa.Array) -> pa.Array:
    ordered = (numbers.view(np.uint64) ^ _SIGN).astype(">u8")
    data = pa.py_buffer(ordered.tobytes())
    fixed = pa.Array.from_buffers(pa.binary(8), len(array), [None, data])
    result = fixed.cast(pa.large_binary())
    return pc.if_else(pc.is_null(array), pa.scalar(None, pa.large_binary()), result)


def _int_lists(array: pa.Array) -> pa.Array:
    """Each list as the concatenation of its elements' 8-byte keys: the list's offsets times 8."""
    offsets = np.asarray(array.offsets, dtype=np.int64)
    values = array.values.slice(offsets[0], offsets[-1] - offsets[0])
    if pc.any(pc.is_null(array.flatten())).as_py():
        raise ConnectorOptionError("sequence_by arrays must not hold nulls")
    encoded = (
        np.asarray(values.cast(pa.int64()).fill_null(0), dtype=np.int64).view(np.uint64) ^ _SIGN
    ).astype(">u8")
    data = pa.py_buffer(encoded.tobytes())
    keys = pa.Array.from_buffers(
        pa.large_binary(), len(array), [None, pa.py_buffer((offsets - offsets[0]) * 8), data]
    )
    return pc.if_else(pc.is_null(array), pa.scalar(None, pa.large_binary()), keys)


_POS, _FOUND, _KID = "_cdcflow_pos", "_cdcflow_found", "_cdcflow_kid"


def group_ids(rows: pa.Table, key: Sequence[str]) -> np.ndarray:
    """Per row of ``rows``, an id of its key: rows with equal keys have equal ids, ids are below
    :func:`id_bound` of the row count (an array indexed by them stays small)."""
    combined: np.ndarray | None = None
    radix = 1
    bound = id_bound(rows.num_rows)
    try:
        for column in key:
            codes, size = _codes(rows.column(column).combine_chunks(), bound)
            if combined is None:
                combined, radix = codes, size
            else:
                if radix * size >= 2**62:
                    combined, radix = _dense(combined)
                combined, radix = combined * size + codes, radix * size
            if radix > bound:
                combined, radix = _dense(combined)
    except pa.ArrowNotImplementedError:  # a nested type: Arrow groups it
        combined = None
    if combined is not None:
        return combined
    keys = list(key)
    ids = rows.select(keys).group_by(keys, use_threads=False).aggregate([])
    ids = ids.append_column(_KID, pa.array(np.arange(ids.num_rows, dtype=np.int64)))
    return _matched(rows, ids, keys, _KID)


def id_bound(rows: int) -> int:
    """The ids :func:`group_ids` gives ``rows`` rows are below this."""
    return 4 * rows + 2**16


def _dense(ids: np.ndarray) -> tuple[np.ndarray, int]:
    """``ids`` renumbered from 0 in order of appearance, and how many there are."""
    encoded = pa.array(ids).dictionary_encode()
    return np.asarray(encoded.indices, dtype=np.int64), len(encoded.dictionary)


def _codes(values: pa.Array, bound: int) -> tuple[np.ndarray, int]:
    """Per value, a code (equal for equal values, a NULL one of its own) and how many codes there may be:
    an integer's offset from the least one when their range is below ``bound``, else a dictionary's."""
    if pa.types.is_integer(values.type) and len(values) > values.null_count:
        low, high = (v.as_py() for v in pc.min_max(values).values())
        if high - low < bound:
            size = high - low + 2
            wide = values.cast(pa.int64()) if high < 2**63 else values  # a uint64 beyond int64
            offsets = pc.subtract(wide, pa.scalar(low, wide.type)).cast(pa.int64()).fill_null(size - 1)
            return np.asarray(offsets, dtype=np.int64), size
    if pa.types.is_dictionary(values.type):  # its codes may skip unused entries
        values = values.dictionary_decode()
    encoded = values.dictionary_encode()
    size = len(encoded.dictionary) + 1  # a NULL is a value of its own
    return np.asarray(encoded.indices.fill_null(size - 1), dtype=np.int64), size


def positions_in(rows: pa.Table, known: pa.Table, key: Sequence[str]) -> np.ndarray:
    """Per row of ``rows``, the position of the row of ``known`` (at most one per key) with its key,
    or -1. ``known``'s key columns are cast to ``rows``' types (the state table reads strings as views)."""
    if known.num_rows == 0:
        return np.full(rows.num_rows, -1, dtype=np.int64)
    keys = list(key)
    cast = {c: known.column(c).cast(rows.schema.field(c).type) for c in keys}
    if len(keys) == 1:
        try:
            values = rows.column(keys[0]).combine_chunks()
            found = pc.index_in(values, value_set=cast[keys[0]].combine_chunks())
            return np.asarray(found.fill_null(-1), dtype=np.int64)
        except pa.ArrowNotImplementedError:
            pass
    table = pa.table({**cast, _FOUND: pa.array(np.arange(known.num_rows, dtype=np.int64))})
    return _matched(rows, table, keys, _FOUND)


def rows_with_keys(rows: pa.Table, keys: pa.Table, key: Sequence[str]) -> pa.Table:
    """The rows of ``rows`` whose key is among ``keys``' (which may repeat a key)."""
    names = list(key)
    if len(names) == 1:
        column = rows.column(names[0])
        try:
            wanted = keys.column(names[0]).cast(column.type).combine_chunks()
            return rows.filter(pc.is_in(column, value_set=wanted))
        except pa.ArrowNotImplementedError:
            pass
    distinct = keys.select(names).group_by(names).aggregate([])
    return rows.filter(pa.array(positions_in(rows, distinct, names) >= 0))


def take_or_null(column: pa.ChunkedArray | pa.Array, positions: np.ndarray) -> pa.Array:
    """``column``'s values at ``positions``; null where a position is -1."""
    indices = pa.array(positions, mask=positions < 0)
    values = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return values.take(indices)


def _matched(rows: pa.Table, table: pa.Table, keys: list[str], column: str) -> np.ndarray:
    probe = rows.select(keys).append_column(_POS, pa.array(np.arange(rows.num_rows, dtype=np.int64)))
    joined = probe.join(table, keys, join_type="left outer", use_threads=False)
    out = np.full(rows.num_rows, -1, dtype=np.int64)
    found = np.asarray(joined.column(column).fill_null(-1), dtype=np.int64)
    out[np.asarray(joined.column(_POS), dtype=np.int64)] = found
    return out


TRUNCATE = "truncate"


class OnTruncate(enum.Enum):
    APPLY = "apply"
    IGNORE = "ignore"
    FAIL = "fail"

    @classmethod
    def parse(cls, value: str | OnTruncate) -> OnTruncate:
        if isinstance(value, OnTruncate):
            return value
        try:
            return cls(value.strip().lower())
        except ValueError:
            raise ConnectorOptionError(
                f"on_truncate must be one of apply, ignore, fail, not {value!r}"
            ) from None


@dataclass(frozen=True)
class Controls:
    """The control rows of a batch: kind, how many change rows arrived before each, where it came from."""

    kinds: list[str]
    before: np.ndarray
    origin: pa.Table
    sequence: pa.Array | None
    restart: pa.Array | None
    batch_id: int

    def where(self, index: int) -> str:
        return describe(self.origin, index, int(self.before[index]) + index, self.batch_id)


@dataclass(frozen=True)
class Truncation:
    """The batch's last TRUNCATE: the changes that sort before it are void."""

    before: int
    sequence: bytes | None
    restart: bytes | None
    where: str

    def void(self, batch: ChangeBatch) -> np.ndarray:
        """Which of ``batch``'s changes the truncate supersedes (by arrival, those without a sequence)."""
        arrival = np.asarray(batch.data.column(IDX), dtype=np.int64) < self.before
        if self.sequence is None or SEQ not in batch.data.schema.names:
            return arrival
        unsequenced = np.asarray(pc.is_null(batch.data.column(SEQ)), dtype=bool)
        seq = pc.fill_null(batch.data.column(SEQ), b"")
        earlier = _earlier(batch, self.sequence, self.restart, seq)
        same = np.asarray(pc.equal(seq, pa.scalar(self.sequence, pa.large_binary())), dtype=bool)
        return np.where(unsequenced, arrival, earlier | (same & arrival))


FLOOR = "cdcflow.truncated"
"""State table property: the last applied TRUNCATE's sequence (with ``sequence_by``)."""


@dataclass(frozen=True)
class Floor:
    """A TRUNCATE applied in an earlier batch: changes of any key that happened before it are late.

    Input partitions reach a batch at different positions, so changes from before a truncate can
    arrive after it (a TRUNCATE event has no key: it sits in any partition). Kept for the delete
    retention, like a tombstone.
    """

    sequence: bytes
    restart: bytes | None
    at: datetime

    def to_json(self) -> str:
        restart = self.restart.hex() if self.restart is not None else None
        return json.dumps({"sequence": self.sequence.hex(), "restart": restart, "at": self.at.isoformat()})

    @classmethod
    def of(cls, state: TableHandle | None, now: datetime, retention: timedelta) -> Floor | None:
        text = state.properties().get(FLOOR) if state is not None else None
        if not text:
            return None
        value = json.loads(text)
        restart = bytes.fromhex(value["restart"]) if value.get("restart") else None
        floor = cls(bytes.fromhex(value["sequence"]), restart, datetime.fromisoformat(value["at"]))
        return floor if floor.at >= now - retention else None

    def late(self, batch: ChangeBatch) -> np.ndarray:
        """Which of ``batch``'s changes happened before the truncate (a change with no sequence never)."""
        if SEQ not in batch.data.schema.names:
            return np.zeros(batch.num_rows, dtype=bool)
        return _earlier(batch, self.sequence, self.restart, batch.data.column(SEQ))


def _earlier(batch: ChangeBatch, sequence: bytes, restart: bytes | None, seq: pa.ChunkedArray) -> np.ndarray:
    """Changes whose sequence is lower, unless their ``restart_by`` is newer (the position restarted)."""
    lower = pc.fill_null(pc.less(seq, pa.scalar(sequence, pa.large_binary())), False)
    if restart is not None and batch.restart is not None:
        newer = pc.fill_null(pc.greater(batch.restart, pa.scalar(restart, pa.large_binary())), False)
        lower = pc.and_(lower, pc.invert(newer))
    return np.asarray(lower, dtype=bool)


def split_controls(
    table: pa.Table,
    control_column: str | None,
    sequence_by: str | None,
    restart_by: str | None,
    batch_id: int,
) -> tuple[pa.Table, Controls | None]:
    """``table``'s change rows, and its control rows (None when it has none)."""
    if control_column is None or control_column not in table.schema.names:
        return table, None
    marks = table.column(control_column)
    is_control = np.asarray(pc.is_valid(marks), dtype=bool)
    if not is_control.any():
        return table, None
    at = np.flatnonzero(is_control)
    take = pa.array(at)
    sequence = restart = None
    if sequence_by is not None and sequence_by in table.schema.names:
        sequence = sortable(table.column(sequence_by).take(take), sequence_by)
    if restart_by is not None and restart_by in table.schema.names:
        restart = sortable(table.column(restart_by).take(take), restart_by)
    controls = Controls(
        kinds=[str(kind).strip().lower() for kind in marks.take(take).to_pylist()],
        before=at - np.arange(len(at)),
        origin=coordinates(table).take(take),
        sequence=sequence,
        restart=restart,
        batch_id=batch_id,
    )
    return table.filter(pa.array(~is_control)), controls


@dataclass
class ControlOutcome:
    truncation: Truncation | None = None
    truncates: int = 0
    others: int = 0


def decide(controls: Controls | None, on_truncate: OnTruncate) -> ControlOutcome:
    """Counts the control events and picks the truncate to apply (the last one), or refuses one."""
    outcome = ControlOutcome()
    if controls is None:
        return outcome
    truncates = [i for i, kind in enumerate(controls.kinds) if kind == TRUNCATE]
    outcome.truncates, outcome.others = len(truncates), len(controls.kinds) - len(truncates)
    if outcome.others:
        log.info(
            "batch %d: %d control event(s) skipped (%s)",
            controls.batch_id,
            outcome.others,
            ", ".join(sorted({k for k in controls.kinds if k != TRUNCATE})),
        )
    if not truncates:
        return outcome
    if on_truncate is OnTruncate.FAIL:
        raise ChangelogConsistencyError(
            f"{controls.where(truncates[0])}: the source table was truncated; on_truncate='fail' refuses "
            "it: set on_truncate='apply' to empty the Delta table too, or 'ignore' to keep its rows"
        )
    if on_truncate is OnTruncate.IGNORE:
        log.warning(
            "batch %d: %d TRUNCATE event(s) ignored (on_truncate='ignore'), first at %s; the Delta table "
            "keeps the rows the source deleted",
            controls.batch_id,
            len(truncates),
            controls.where(truncates[0]),
        )
        return outcome
    sequences = (
        controls.sequence.to_pylist() if controls.sequence is not None else [None] * len(controls.kinds)
    )
    last = max(truncates, key=lambda i: (sequences[i] or b"", controls.before[i], i))
    restart = controls.restart[last].as_py() if controls.restart is not None else None
    outcome.truncation = Truncation(
        int(controls.before[last]), sequences[last], restart, controls.where(last)
    )
    log.warning(
        "batch %d: TRUNCATE at %s ends every row of the Delta table",
        controls.batch_id,
        outcome.truncation.where,
    )
    return outcome
