"""Debezium JSON straight to Arrow: a block of envelopes → one record batch of changelog rows.

The hot path of the ``cdc-debezium`` sources. Arrow's JSON reader parses the whole block against an
explicit ``{op, before, after}`` schema, numpy builds the changelog's take indices (``c``/``r`` → +I,
``u`` → -U +U, ``d`` → -D) and each column is converted vectorised. No per-message Python objects.

The result is exactly what :class:`~cdcflow.formats.debezium.json.DebeziumJsonDecoder` gives message
by message, or None: whatever the per-record decoder would treat differently from plain data (a parse
error, a control event, an unchanged-TOAST placeholder it cannot place, a NULL in a NOT NULL column,
an update without its before image, JSON that Arrow's reader accepts but the per-record parser
refuses) sends the whole block back to the per-record path. Placeholders are filled from the before
image, and under ``unavailable-values=fill`` with Kafka keys from each key's last image
(:mod:`.arrow_fill`), or reported.

A block is laid out for Arrow's reader as one buffer (:class:`Block`), with the checks that make its
reading agree with orjson's message for message: Arrow's reader (RapidJSON) accepts some text orjson
refuses (NaN/Infinity literals and numbers beyond the double range or nested deeper than 1024 in fields
it skips, invalid UTF-8, a byte order mark, several documents in one message). A block with any of those
is not read columnar.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from cdcflow.formats.base import Decoder, Headers, metadata_column_name
from cdcflow.formats.debezium.arrow_columns import (
    SUPPORTED,
    ColumnPlan,
    PositionFieldsNeeded,
    envelope_fields,
    metadata_columns,
    placeholder_texts,
    plan_column,
    unavailable_lists,
    validity,
)
from cdcflow.formats.debezium.arrow_fill import Images, StateKey, fill_from_keys, state_keys
from cdcflow.formats.debezium.arrow_payloads import Payloads
from cdcflow.formats.debezium.envelope import (
    KEY_HEADERS,
    DebeziumMode,
    UnavailableHandling,
    reports_unavailable,
)
from cdcflow.formats.debezium.json import DebeziumJsonDecoder
from cdcflow.formats.types import TypeKind

_OPS = pa.array(["c", "r", "u", "d"])
_UPDATE, _DELETE = 2, 3
_KINDS = pa.array(["+I", "-U", "+U", "-D"])
#: The first row kind of each op code (its index in _OPS); an update adds +U after its -U.
_FIRST_KIND = np.array([0, 0, 1, 3], dtype=np.int8)
#: The one row kind of each op code under ``changelog-mode=upsert``: ``u`` gives +U alone.
_UPSERT_KIND = np.array([0, 0, 2, 3], dtype=np.int8)


@dataclass(frozen=True)
class ColumnarBatch:
    """The changelog of a block: ``rows`` has the physical columns then the row kind (``+I`` ...);
    ``message_index[i]`` is the index, in the decoded block, of the message row ``i`` came from;
    ``changed`` is how many messages gave rows (every one that is not a tombstone or blank);
    ``messages`` how many the block had, blank ones too (for :meth:`ColumnarDecoder.decode_lines`, its
    lines); ``unavailable_values`` and ``filled_values`` count unchanged-TOAST placeholders left NULL
    and taken from the before image, as the per-record decoder's metrics do."""

    rows: pa.RecordBatch
    message_index: pa.Array
    changed: int
    messages: int
    unavailable_values: int = 0
    filled_values: int = 0


class ColumnarDecoder:
    """Decodes blocks of Debezium JSON envelopes into changelog record batches (under ``schema-include``
    the envelopes of Connect's ``{schema, payload}`` messages, see :mod:`.arrow_payloads`).

    Build it with :meth:`for_decoder`; it pickles to its plan, for Spark's executors.
    """

    def __init__(
        self,
        columns: tuple[ColumnPlan, ...],
        physical: pa.Schema,
        row_kind_column: str,
        keyed_state: bool,
        *,
        upsert: bool = False,
        metadata: tuple[str, ...] = (),
        reports: bool = False,
        key_columns: tuple[str, ...] = (),
        payloads: Payloads | None = None,
    ) -> None:
        self.columns = columns
        self.physical = physical
        self.row_kind_column = row_kind_column
        self.keyed_state = keyed_state
        self.upsert = upsert
        """``changelog-mode=upsert``: ``u`` gives +U alone, no before image needed."""
        self.metadata = metadata
        self.reports = reports
        """A placeholder (unchanged TOAST) is NULL and listed in ``unavailable-columns``, unless the
        event's before image has the value."""
        self.key_columns = key_columns
        self.payloads = payloads
        """``schema-include``: the messages' schema blocks, stripped before Arrow's reader sees them."""
        self.fill_state: Images | None = None
        """The per-record decoder's filling state, shared (``keyed_state``): set by :meth:`for_decoder`;
        without it a block with keys goes through the per-record decoder."""
        self._output = pa.schema([*physical, pa.field(row_kind_column, pa.string(), nullable=False)])
        self._metadata_types = [f.type for f in physical][len(columns) :]
        self._placeholder_checked = [reports and plan.kind is TypeKind.STRING for plan in columns]
        image = pa.struct([pa.field(c.name, c.parsed_as) for c in columns])
        self._parse_options, self._postgres_options = (
            pa_json.ParseOptions(
                explicit_schema=pa.schema(
                    [("op", pa.string()), ("before", image), ("after", image), *fields]
                ),
                unexpected_field_behavior="ignore",
                newlines_in_values=True,
            )
            for fields in (envelope_fields(metadata), envelope_fields(metadata, postgres=True))
        )
        self._postgres = "source.sequence" in metadata
        """Whether blocks are parsed with PostgreSQL's position fields only: until one has another."""

    @property
    def reads_headers(self) -> bool:
        """Whether metadata comes from the messages' headers (Debezium's old and new keys)."""
        return any(key in KEY_HEADERS for key in self.metadata)

    def __reduce__(self) -> tuple[Any, tuple[object, ...]]:
        return _rebuild, (
            self.columns,
            self.physical,
            self.row_kind_column,
            self.keyed_state,
            self.upsert,
            self.metadata,
            self.reports,
            self.key_columns,
            self.payloads,
        )

    @classmethod
    def for_decoder(
        cls, decoder: Decoder, physical: pa.Schema, *, row_kind_column: str = "_row_kind"
    ) -> ColumnarDecoder | None:
        """The columnar twin of ``decoder`` producing ``physical`` (Spark's Arrow schema of the declared
        columns, then the metadata columns), or None when its configuration has no columnar path: not
        ``debezium-json``, metadata other than the position, timestamps, key headers and unavailable
        columns, key columns that index the TOAST-filling state, or a column
        type this path does not read (DECIMAL, BINARY, nested types)."""
        if not isinstance(decoder, DebeziumJsonDecoder):
            return None
        config = decoder.config
        if config.schema is None or not set(config.metadata) <= SUPPORTED:
            return None
        fill = config.unavailable is UnavailableHandling.FILL
        if fill and config.key_columns:
            return None
        if len(physical) != len(config.schema) + len(config.metadata):
            return None
        names = [metadata_column_name(key) for key in config.metadata]
        if [f.name for f in physical][len(config.schema) :] != names:
            return None
        reports = reports_unavailable(config.metadata, config.unavailable) and not fill
        plans = [
            plan_column(column, field, relaxed=reports)
            for column, field in zip(config.schema, physical, strict=False)
        ]
        if any(plan is None for plan in plans):
            return None
        columnar = cls(
            tuple(plan for plan in plans if plan is not None),
            physical,
            row_kind_column,
            keyed_state=fill,
            upsert=config.mode is DebeziumMode.UPSERT,
            metadata=tuple(config.metadata),
            reports=reports,
            key_columns=tuple(config.key_columns),
            payloads=(
                Payloads(config.schema, fail_on_new_columns=config.fail_on_new_columns)
                if config.schema_include
                else None
            ),
        )
        columnar.fill_state = decoder.fill_state
        return columnar

    def decode(
        self,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None = None,
        headers: Sequence[Headers] | None = None,
    ) -> ColumnarBatch | None:
        """The changelog of ``values`` (message values; None or blank is a tombstone, giving no row), or
        None when the block must be decoded message by message.

        Pass the messages' Kafka ``keys`` when they have any: with ``unavailable-values=fill`` each
        key's last image fills unchanged TOAST values; the block reads and updates that state, which
        it shares with the per-record decoder (:mod:`.arrow_fill`).
        """
        block = self._block(values)
        if self.keyed_state and keys is not None and any(key is not None for key in keys):
            return self._decode(block, headers, keys)
        return self._decode(block, headers)

    def decode_array(
        self, values: pa.Array, keys: pa.Array | None = None, headers: Sequence[Headers] | None = None
    ) -> ColumnarBatch | None:
        """:meth:`decode` of message values and keys as Arrow arrays (binary, null for a tombstone)."""
        keyed = (
            keys.to_pylist()
            if self.keyed_state and keys is not None and keys.null_count < len(keys)
            else None
        )
        if self.payloads is not None or not (
            pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type)
        ):
            return self._decode(self._block(values.to_pylist()), headers, keyed)
        return self._decode(Block.of_array(values), headers, keyed)

    def decode_lines(self, block: bytes) -> ColumnarBatch | None:
        """:meth:`decode` of the lines of ``block`` (a chunk of a file of messages, one per line, as the
        file reader splits it: no line break, blank lines skipped); ``message_index`` counts lines."""
        if self.payloads is None:
            return self._decode(Block.of_lines(block))
        envelopes = self.payloads.of_lines(block)
        return self._decode(Block.of_values(envelopes) if envelopes is not None else None)

    def _block(self, values: Sequence[bytes | None]) -> Block | None:
        """The messages ``values`` (their envelopes under ``schema-include``) as one block."""
        if self.payloads is None:
            return Block.of_values(values)
        envelopes = self.payloads.of(values)
        return Block.of_values(envelopes) if envelopes is not None else None

    def _decode(
        self,
        block: Block | None,
        headers: Sequence[Headers] | None = None,
        keys: Sequence[bytes | None] | None = None,
    ) -> ColumnarBatch | None:
        if block is None or not block.is_strict_json():
            return None
        found: list[StateKey] | None = None
        if keys is not None:
            if self.fill_state is None:
                return None
            found = state_keys(_at(keys, block.positions))
            if found is None:
                return None
        if len(block.positions) == 0:
            return ColumnarBatch(_empty(self._output), pa.array([], pa.int64()), 0, len(block.offsets) - 1)
        if headers is not None:
            headers = _at(headers, block.positions)
        if self._postgres:
            try:
                return self._parsed(block, headers, found, postgres=True)
            except PositionFieldsNeeded:
                self._postgres = False  # this source has other connectors' positions: parse them all
        return self._parsed(block, headers, found, postgres=False)

    def _parsed(
        self,
        block: Block,
        headers: Sequence[Headers] | None,
        keys: Sequence[StateKey] | None,
        *,
        postgres: bool,
    ) -> ColumnarBatch | None:
        try:
            table = pa_json.read_json(
                pa.py_buffer(block.data),
                read_options=pa_json.ReadOptions(use_threads=False, block_size=len(block.data) + 1),
                parse_options=self._postgres_options if postgres else self._parse_options,
            )
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
        if table.num_rows != len(block.positions):
            return None  # some value held more than one JSON document
        return self._changelog(table.combine_chunks().to_batches()[0], block, headers, postgres, keys)

    def _changelog(
        self,
        parsed: pa.RecordBatch,
        block: Block,
        headers: Sequence[Headers] | None,
        postgres: bool,
        keys: Sequence[StateKey] | None = None,
    ) -> ColumnarBatch | None:
        codes_array = pc.index_in(parsed.column(0), value_set=_OPS)
        if codes_array.null_count:
            return None  # a control event (t, m), an unknown or missing op
        codes = codes_array.to_numpy()
        before, after = parsed.column(1), parsed.column(2)
        needs_before = codes == _DELETE if self.upsert else codes >= _UPDATE
        if not _valid_where(after, codes != _DELETE) or not _valid_where(before, needs_before):
            return None  # an image the operation needs is null (e.g. REPLICA IDENTITY DEFAULT)
        message, kinds = _expand(codes, upsert=self.upsert)
        from_before = (kinds & 1).astype(np.int64)  # -U and -D are the odd kinds
        take = pa.array(message + len(codes) * from_before)  # the before images follow the after ones
        has_before = validity(before)
        missing = np.zeros((len(codes), len(self.columns)), dtype=np.bool_)
        filled = 0
        checks = [
            checked or (keys is not None and plan.kind is TypeKind.STRING)
            for checked, plan in zip(self._placeholder_checked, self.columns, strict=True)
        ]
        afters, befores = [], []
        for index, plan in enumerate(self.columns):
            checked = checks[index]
            images = [_column(image, index, plan, placeholders=checked) for image in (after, before)]
            if images[0] is None or images[1] is None:
                return None
            if checked:
                if not plan.nullable and not self.reports and any(_is_placeholder(i).any() for i in images):
                    return None  # the per-record path refuses a NULL for it in a NOT NULL column
                unsent = self._unsent(images[0], images[1], has_before, plan.name)
                if unsent is None:
                    return None
                images[0], images[1], missing[:, index], column_filled = unsent
                filled += column_filled
            afters.append(images[0])
            befores.append(images[1])
        commit = None
        if keys is not None and self.fill_state is not None and any(key is not None for key in keys):
            names = [plan.name for plan in self.columns]
            keyed = fill_from_keys(self.fill_state, codes == _DELETE, keys, afters, missing, names, checks)
            afters, missing, commit = keyed.afters, keyed.missing, keyed.commit
            filled += keyed.filled
        arrays = [pa.concat_arrays([a, b]).take(take) for a, b in zip(afters, befores, strict=True)]
        if self.metadata:
            names = [plan.name for plan in self.columns]
            unavailable = (
                unavailable_lists(missing, names) if "unavailable-columns" in self.metadata else None
            )
            extra = metadata_columns(
                self.metadata, self._metadata_types, parsed, unavailable, headers, postgres=postgres
            )
            if extra is None:
                return None
            at = pa.array(message)
            arrays.extend(column.take(at) for column in extra)
        arrays.append(_KINDS.take(pa.array(kinds)))
        rows = pa.RecordBatch.from_arrays(arrays, schema=self._output)
        if commit is not None:
            commit()
        return ColumnarBatch(
            rows,
            pa.array(block.positions[message]),
            len(codes),
            len(block.offsets) - 1,
            unavailable_values=int(missing.sum()),
            filled_values=filled,
        )

    def _unsent(
        self, after: pa.Array, before: pa.Array, has_before: npt.NDArray[np.bool_], name: str
    ) -> tuple[pa.Array, pa.Array, npt.NDArray[np.bool_], int] | None:
        """A column's placeholders: NULL in the before image; in the after image the before image's
        value where it has one, else NULL and listed as missing (None: a key column lacks its value).
        Returns both images, where the after image is missing its value, and how many were filled."""
        unsent_after = _is_placeholder(after)
        unsent_before = _is_placeholder(before)
        if not (unsent_after.any() or unsent_before.any()):
            return after, before, unsent_after, 0
        if name in self.key_columns:
            return None  # the per-record path fails the record
        from_before = unsent_after & has_before & ~unsent_before
        before = pc.if_else(pa.array(unsent_before), pa.scalar(None, before.type), before)
        after = pc.if_else(
            pa.array(from_before),
            before,
            pc.if_else(pa.array(unsent_after), pa.scalar(None, after.type), after),
        )
        return after, before, unsent_after & ~from_before, int(from_before.sum())


def _expand(codes: npt.NDArray[np.int8], *, upsert: bool = False) -> tuple[Positions, npt.NDArray[np.int8]]:
    """For each changelog row: the message it comes from and its kind (an index in _KINDS)."""
    if upsert:
        return np.arange(len(codes)), _UPSERT_KIND[codes]
    rows_per_message = 1 + (codes == _UPDATE)
    message = np.repeat(np.arange(len(codes)), rows_per_message)
    kinds = np.repeat(_FIRST_KIND[codes], rows_per_message)
    first_row = np.cumsum(rows_per_message) - rows_per_message
    kinds[first_row[codes == _UPDATE] + 1] = 2
    return message, kinds


def _at(items: Sequence[Any], positions: Positions) -> list[Any]:
    """The items of the messages at ``positions`` (all of them when no message was blank)."""
    if len(positions) == len(items):
        return list(items)  # the positions are 0..n-1
    return [items[i] for i in positions.tolist()]


def _empty(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)


def _is_placeholder(values: pa.Array) -> npt.NDArray[np.bool_]:
    found = pc.is_in(values, value_set=placeholder_texts())
    return pc.fill_null(found, False).to_numpy(zero_copy_only=False)  # type: ignore[no-any-return]


def _rebuild(
    columns: tuple[ColumnPlan, ...],
    physical: pa.Schema,
    row_kind_column: str,
    keyed_state: bool,
    upsert: bool,
    metadata: tuple[str, ...],
    reports: bool,
    key_columns: tuple[str, ...],
    payloads: Payloads | None,
) -> ColumnarDecoder:
    return ColumnarDecoder(
        columns,
        physical,
        row_kind_column,
        keyed_state,
        upsert=upsert,
        metadata=metadata,
        reports=reports,
        key_columns=key_columns,
        payloads=payloads,
    )


def _valid_where(image: pa.StructArray, needed: npt.NDArray[np.bool_]) -> bool:
    if image.null_count == 0:
        return True
    valid = image.is_valid().to_numpy(zero_copy_only=False)
    return bool(np.all(valid | ~needed))


def _column(
    image: pa.StructArray, index: int, plan: ColumnPlan, *, placeholders: bool = False
) -> pa.Array | None:
    """One column of every image (those the changelog does not use are checked too, as per record);
    ``placeholders``: a text column's placeholders are kept, for the caller to handle."""
    parsed = image.field(index)
    if (
        not plan.nullable
        and parsed.null_count
        and pc.any(pc.and_(parsed.is_null(), image.is_valid())).as_py()
    ):
        return None  # a NULL in a NOT NULL column of an image that is there
    return parsed if placeholders else plan.convert(parsed)


_OPEN_BRACE, _CLOSE_BRACE, _NEWLINE, _RETURN = b"{}\n\r"
_OPEN_BRACKET = ord("[")
_JSON_WHITESPACE = b" \t\r\n"
#: NaN/Infinity literals, and numbers that could overflow a double (below 10**(digits + exponent)):
#: Arrow's reader takes them, orjson refuses them (checked, message by message, where this matches).
#: A value starts after ``:``, ``[`` or ``,``: an exponent is looked for in a number there, not in a
#: string such as a UUID ("123e4567-...", which made every message of a table with one doubtful).
_SUSPICIOUS = (
    r"[:,\[][ \t\r\n]*-?(?:NaN|Inf)|[0-9]{150}"
    r"|[:,\[][ \t\r\n]*-?[0-9]+(?:\.[0-9]+)?[eE]\+?0*[1-9][0-9][0-9]"
)
#: Literals RE2 finds at memchr speed (the pattern above goes byte by byte): a block with neither,
#: no exponent and no long run of digits cannot match it.
_LITERALS = ("NaN", "Inf")
#: What counting one long message's brackets costs in Python, as bytes of a pass over the whole block.
_BYTES_PER_COUNT = 2048
_EIGHT_DIGITS = np.uint64(0x0101010101010101)
_DIGIT_RUN = re.compile(rb"[0-9]{150}")
_SCAN_BYTES = 1 << 18  # a multiple of 64
#: orjson refuses nesting deeper than 1024: a message with fewer brackets cannot reach it.
_MAX_BRACKETS = 1000
MAX_BLOCK_BYTES = 1 << 30

Positions = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Block:
    """Newline-delimited messages: ``data[offsets[i]:offsets[i + 1]]`` is message ``i`` and its line
    break; ``positions`` are the messages that are not blank (blank ones give no row)."""

    data: bytes | memoryview
    offsets: Positions
    positions: Positions

    @classmethod
    def of_values(cls, values: Sequence[bytes | None]) -> Block | None:
        """Message values (None or blank: a tombstone); None if one cannot be one JSON object."""
        present: Sequence[bytes] = (
            [b"" if value is None else value for value in values]
            if None in values
            else cast("Sequence[bytes]", values)
        )
        lengths = np.fromiter(map(len, present), dtype=np.int64, count=len(present))
        data = b"\n".join(itertools.chain(present, (b"",)))
        offsets = np.zeros(len(present) + 1, dtype=np.int64)
        np.cumsum(lengths + 1, out=offsets[1:])
        return cls._checked(data, offsets, present)

    @classmethod
    def of_array(cls, values: pa.Array) -> Block | None:
        """:meth:`of_values` of an Arrow binary array (Spark's Kafka ``value`` column), without a Python
        object per message; None if a value cannot be one JSON object."""
        if len(values) == 0:
            return cls.of_values([])
        separator, nothing = pa.scalar(b"\n", values.type), pa.scalar(b"", values.type)
        lines = pc.binary_join_element_wise(values, nothing, separator, null_handling="replace")
        offset_type = np.dtype(np.int64 if pa.types.is_large_binary(values.type) else np.int32)
        bounds = np.frombuffer(
            lines.buffers()[1], offset_type, len(lines) + 1, lines.offset * offset_type.itemsize
        )
        first, end = int(bounds[0]), int(bounds[-1])
        data = memoryview(lines.buffers()[2])[first:end] if end > first else b""
        return cls._checked(data, bounds.astype(np.int64) - first, None)

    @classmethod
    def of_lines(cls, block: bytes) -> Block | None:
        """Lines, each a message without its line break (``\\r\\n`` too); blank lines are skipped."""
        data = block if block.endswith(b"\n") else block + b"\n"
        view = np.frombuffer(data, dtype=np.uint8)
        offsets = np.concatenate(([0], np.flatnonzero(view == _NEWLINE) + 1)).astype(np.int64)
        return cls._checked(data, offsets, None)

    @classmethod
    def _checked(
        cls, data: bytes | memoryview, offsets: Positions, values: Sequence[bytes] | None
    ) -> Block | None:
        if len(data) > MAX_BLOCK_BYTES:
            return None
        view = np.frombuffer(data, dtype=np.uint8)
        starts, ends = offsets[:-1], offsets[1:] - 1  # ends: each message's line break
        blank = ends == starts
        last = np.maximum(ends - 1, starts)
        last -= (view[last] == _RETURN) & (last > starts)
        plain = (view[starts] == _OPEN_BRACE) & (view[last] == _CLOSE_BRACE)
        for index in np.flatnonzero(~blank & ~plain):
            value = values[int(index)] if values is not None else bytes(data[starts[index] : ends[index]])
            shape = _shape(value)
            if shape is None:
                return None
            blank[index] = shape == "blank"
        return cls(data, offsets, np.flatnonzero(~blank))

    def is_strict_json(self) -> bool:
        """Whether orjson reads every message Arrow's reader will read (see the module's docstring)."""
        whole = _binary(self.data, np.array([0, len(self.data)]))
        try:
            whole.cast(pa.string())
        except pa.ArrowInvalid:
            return False
        doubtful = np.zeros(len(self.offsets) - 1, dtype=np.bool_)
        literals = (pc.match_substring_regex(whole, literal)[0].as_py() for literal in _LITERALS)
        if _may_have_long_number(self.data) or any(literals):
            messages = _binary(self.data, self.offsets)
            doubtful |= pc.match_substring_regex(messages, _SUSPICIOUS).to_numpy(zero_copy_only=False)
        long = np.flatnonzero(np.diff(self.offsets) > _MAX_BRACKETS)
        # A few long messages are counted where they are, at memchr's speed; many, in one pass.
        if len(long) and isinstance(self.data, bytes) and len(long) * _BYTES_PER_COUNT < len(self.data):
            data, starts, ends = self.data, self.offsets[long].tolist(), self.offsets[long + 1].tolist()
            for at, start, end in zip(long.tolist(), starts, ends, strict=True):
                doubtful[at] |= data.count(b"{", start, end) + data.count(b"[", start, end) > _MAX_BRACKETS
        elif len(long):
            doubtful |= _brackets(self.data, self.offsets) > _MAX_BRACKETS
        for index in np.flatnonzero(doubtful):
            try:
                orjson.loads(self.data[self.offsets[index] : self.offsets[index + 1]])
            except orjson.JSONDecodeError:
                return False
        return True


def _brackets(data: bytes | memoryview, offsets: Positions) -> Positions:
    """Per message, how many ``{`` and ``[`` it holds: counted in windows of whole messages of about
    :data:`_SCAN_BYTES` (a flag per byte of a window, not of the block)."""
    view = np.frombuffer(data, dtype=np.uint8)
    counts = np.empty(len(offsets) - 1, dtype=np.int64)
    first = 0
    while first < len(counts):
        last = max(first + 1, int(np.searchsorted(offsets, offsets[first] + _SCAN_BYTES, side="right")) - 1)
        start = offsets[first]
        part = view[start : offsets[last]]
        flags = part == _OPEN_BRACE
        flags |= part == _OPEN_BRACKET
        counts[first:last] = np.add.reduceat(flags, offsets[first:last] - start, dtype=np.int64)
        first = last
    return counts


def _may_have_long_number(data: bytes | memoryview) -> bool:
    """False if no number in ``data`` has an exponent (an e or E after a digit) or 150 digits in a row.

    Such a run covers 8 aligned 8-byte words of digits, or ends in the bytes after the last whole 64.
    Scanned in parts that stay in the CPU cache across the few passes over each.
    """
    view = np.frombuffer(data, dtype=np.uint8)
    aligned = len(view) // 64 * 64
    for start in range(0, len(view), _SCAN_BYTES):
        part = view[start : start + _SCAN_BYTES + 1]  # and the next part's first byte
        digits = np.less(np.subtract(part, ord("0"), dtype=np.uint8), 10)
        exponents = np.equal(np.bitwise_or(part[1:], 0x20), ord("e"))
        exponents &= digits[:-1]
        if exponents.any():
            return True
        full_words = digits[: max(0, min(_SCAN_BYTES, aligned - start))].view(np.uint64) == _EIGHT_DIGITS
        if np.any(full_words.view(np.uint64) == _EIGHT_DIGITS):
            return True
    return _DIGIT_RUN.search(data, max(0, aligned - 160)) is not None


def _binary(data: bytes | memoryview, offsets: Positions) -> pa.Array:
    """A binary array over ``data`` (no copy) split at ``offsets``."""
    buffers = [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)]
    return pa.Array.from_buffers(pa.binary(), len(offsets) - 1, buffers)


def _shape(value: bytes) -> str | None:
    """A message whose first or last byte is not a brace: ``blank``, an ``object`` with JSON whitespace
    around it, or None (anything else, including other whitespace, which orjson refuses)."""
    trimmed = value.strip(_JSON_WHITESPACE)
    if trimmed != value.strip():
        return None
    if not trimmed:
        return "blank"
    return "object" if trimmed[:1] == b"{" and trimmed[-1:] == b"}" else None
