"""A block of JSON messages laid out for Arrow's JSON reader, and the checks that make its reading
agree with the per-record parser (orjson) message for message.

Arrow's reader (RapidJSON) accepts some text orjson refuses: NaN/Infinity literals and numbers beyond
the double range or nested deeper than 1024 in fields it skips, invalid UTF-8, a byte order mark, and
several documents in one message. A block with any of those is not read columnar.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import numpy.typing as npt
import orjson
import pyarrow as pa
import pyarrow.compute as pc

_OPEN_BRACE, _CLOSE_BRACE, _NEWLINE, _RETURN = b"{}\n\r"
_OPEN_BRACKET = ord("[")
_JSON_WHITESPACE = b" \t\r\n"
#: NaN/Infinity literals, and numbers that could overflow a double (below 10**(digits + exponent)):
#: Arrow's reader takes them, orjson refuses them (checked, message by message, where this matches).
_SUSPICIOUS = r"[:,\[][ \t\r\n]*-?(?:NaN|Inf)|[0-9]{150}|[0-9][eE]\+?0*[1-9][0-9][0-9]"
#: Literals RE2 finds at memchr speed (the pattern above goes byte by byte): a block with neither,
#: no exponent and no long run of digits cannot match it.
_LITERALS = ("NaN", "Inf")
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
        if np.max(np.diff(self.offsets), initial=0) > _MAX_BRACKETS:
            view = np.frombuffer(self.data, dtype=np.uint8)
            brackets = (view == _OPEN_BRACE) | (view == _OPEN_BRACKET)
            doubtful |= np.add.reduceat(brackets, self.offsets[:-1], dtype=np.int64) > _MAX_BRACKETS
        for index in np.flatnonzero(doubtful):
            try:
                orjson.loads(self.data[self.offsets[index] : self.offsets[index + 1]])
            except orjson.JSONDecodeError:
                return False
        return True


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
