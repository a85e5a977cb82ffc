"""Unchanged-TOAST values of a columnar block filled per Kafka key (``unavailable-values=fill``).

The per-record decoder keeps each key's last after image (:class:`.envelope.ChangeBuilder`'s LRU state)
and fills a placeholder the event's before image lacks from it. The columnar path shares that state:
a block's placeholders (rare) are filled from the key's previous message in the block, else from the
state, walking only the messages that carry one; the state then takes each key's last message of the
block (a delete drops the key), in the order of those messages, as the per-record decoder leaves it.
Only text columns are kept for a key: they are the ones a placeholder can stand in for here.
"""

from __future__ import annotations

import functools
import itertools
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from cdcflow.formats.debezium.envelope import fields_key
from cdcflow.formats.debezium.json import state_key_fields
from cdcflow.formats.errors import FieldError
from cdcflow.formats.json_decode import UNAVAILABLE
from cdcflow.formats.lru import LruCache

StateKey = Hashable | None
Images = LruCache[Hashable, dict[str, Any]]


def state_keys(keys: Sequence[bytes | None]) -> list[StateKey] | None:
    """The filling-state key of each message, as :meth:`.envelope.ChangeBuilder.state_key` makes it from
    the Kafka key (None: no key, or not a JSON object); None when a key is nested too deep (the
    per-record decoder fails that message)."""
    flat = _one_field_keys(keys)
    if flat is not None:
        return flat
    known: dict[bytes, StateKey] = {}
    found: list[StateKey] = []
    for key in keys:
        if not key or key.lstrip()[:1] != b"{":  # not a JSON object: no state (as per record)
            found.append(None)
            continue
        if key not in known:
            try:
                known[key] = fields_key(state_key_fields(key))
            except FieldError:
                return None
        found.append(known[key])
    return found


def _one_field_keys(keys: Sequence[bytes | None]) -> list[StateKey] | None:
    """The state keys of a block whose keys are all JSON objects of one integer or text field
    (``{"id":42}``, as Kafka Connect's JsonConverter writes a one-column key without its schema), read
    by Arrow at once; None for any other block (a key missing, blank, wrapped with its schema, of
    several fields or another type), which is read key by key."""
    if not keys or None in keys:
        return None
    joined = b"\n".join(cast(list[bytes], keys))
    if joined.count(b"\n") != len(keys) - 1 or joined.count(b"\n{") != len(keys) - 1 or joined[:1] != b"{":
        return None  # a key spans lines, is blank or opens with blanks: not one JSON object per line
    try:
        table = pa_json.read_json(
            pa.py_buffer(joined),
            read_options=pa_json.ReadOptions(use_threads=False, block_size=len(joined) + 1),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None  # not JSON, a field named twice, types that differ from key to key
    if table.num_rows != len(keys) or table.num_columns != 1:
        return None
    try:  # Arrow's reader lets invalid UTF-8 through, in a name or a value; orjson refuses it
        name, column = table.column_names[0], table.column(0)
        if column.null_count or not (pa.types.is_int64(column.type) or pa.types.is_string(column.type)):
            return None  # a null, a number beyond 64 bits or with a fraction, a nested value
        return list(zip(itertools.repeat(name), column.to_pylist()))  # fields_key's pairs
    except UnicodeDecodeError:
        return None


@dataclass
class KeyedFill:
    """A block's after images with the placeholders the state fills, and the state's update to apply
    once the block is decoded (:meth:`commit`)."""

    afters: list[pa.Array]
    missing: npt.NDArray[np.bool_]
    filled: int
    commit: Callable[[], None]


def fill_from_keys(
    images: Images,
    deletes: npt.NDArray[np.bool_],
    keys: Sequence[StateKey],
    afters: list[pa.Array],
    missing: npt.NDArray[np.bool_],
    names: Sequence[str],
    checked: Sequence[bool],
) -> KeyedFill:
    """``afters``: each column's after images (a message per row), ``missing[m, c]``: message ``m``'s
    column ``c`` is a placeholder its before image did not fill; ``deletes``: which messages are deletes.

    The state's keys are followed message by message as the per-record decoder changes them (a message
    makes its key the most recent, a delete drops it, the least recent goes beyond the state's size), so
    a key the per-record decoder would have forgotten by a message fills nothing there; the values are
    written once, by :meth:`KeyedFill.commit`."""
    text = [c for c, is_text in enumerate(checked) if is_text]
    if not missing.any() and not deletes.any():  # nothing to fill, no key dropped: only the last writes
        return KeyedFill(
            list(afters), missing, 0, functools.partial(_write, images, keys, afters, names, text)
        )
    patches: dict[int, dict[int, Any]] = {}  # column -> message -> value
    last_of: dict[StateKey, int] = {}
    filled = 0
    # The state as this block leaves it; a value None: the key's last message here writes it at commit.
    order = cast("OrderedDict[StateKey, dict[str, Any] | None]", images.entries())
    move, evict, size = order.move_to_end, order.popitem, images.size
    wanted = set(np.flatnonzero(missing.any(axis=1)).tolist())
    dropping = deletes.tolist()
    for message, key in enumerate(keys):
        if key is None:
            continue
        if message in wanted and key in order:
            previous = last_of.get(key)  # in this block, and no delete since: the key is in the state
            stored = order[key] if previous is None else None
            for column in np.flatnonzero(missing[message]).tolist():
                if previous is None:
                    value = UNAVAILABLE if stored is None else stored.get(names[column], UNAVAILABLE)
                else:
                    value = _value(afters, missing, patches, previous, column)
                if value is not UNAVAILABLE:
                    patches.setdefault(column, {})[message] = value
                    missing[message, column] = False
                    filled += 1
        last_of[key] = message
        if dropping[message]:
            order.pop(key, None)
            continue
        order[key] = None
        move(key)
        if len(order) > size:
            evict(last=False)
    patched = list(afters)
    for column, values in patches.items():
        mask = np.zeros(len(afters[column]), dtype=np.bool_)
        ordered = sorted(values)
        mask[ordered] = True
        replacements = pa.array([values[m] for m in ordered], afters[column].type)
        patched[column] = pc.replace_with_mask(afters[column], pa.array(mask), replacements)

    def commit() -> None:
        written = [key for key in last_of if key in order]  # their last message put them
        at = np.fromiter((last_of[key] for key in written), dtype=np.int64, count=len(written))
        rows = _images(patched, names, text, at)
        for index, column in zip(*np.nonzero(missing[at][:, text]), strict=True):
            rows[int(index)][names[text[int(column)]]] = UNAVAILABLE
        order.update(zip(written, rows, strict=True))  # in place: the order stays
        images.replace(cast("OrderedDict[Hashable, dict[str, Any]]", order))

    return KeyedFill(patched, missing, filled, commit)


def _write(
    images: Images, keys: Sequence[StateKey], afters: list[pa.Array], names: Sequence[str], text: list[int]
) -> None:
    """The state after a block of writes only: each key's last image, by its last message."""
    last_of = {key: message for message, key in enumerate(keys) if key is not None}
    written = list(last_of)
    if len(written) != len(keys) - list(keys).count(None):  # a key came again: order by its last message
        written.sort(key=last_of.__getitem__)
    written = written[-images.size :]
    at = np.fromiter(map(last_of.__getitem__, written), dtype=np.int64, count=len(written))
    kept = {column: afters[column] for column in text}  # what waits: the text columns, not the block
    images.put_all_later(written, lambda positions: _images(kept, names, text, at[positions]))


def _images(
    afters: Sequence[pa.Array] | Mapping[int, pa.Array],
    names: Sequence[str],
    text: list[int],
    at: npt.NDArray[np.int64],
) -> list[dict[str, Any]]:
    """The state's image of each message at ``at``: its ``text`` columns by name."""
    taken = pa.array(at)
    return _rows([names[c] for c in text], [afters[c].take(taken).to_pylist() for c in text], len(at))


def _rows(names: list[str], columns: list[list[Any]], count: int) -> list[dict[str, Any]]:
    """A dict per row of ``columns``, named ``names`` (dict displays for the usual one to three text
    columns: a quarter of ``dict(zip(...))``'s time, paid for each key of each block)."""
    if len(names) == 1:
        (a,), (xs,) = names, columns
        return [{a: x} for x in xs]
    if len(names) == 2:
        (a, b), (xs, ys) = names, columns
        return [{a: x, b: y} for x, y in zip(xs, ys, strict=True)]
    if len(names) == 3:
        (a, b, c), (xs, ys, zs) = names, columns
        return [{a: x, b: y, c: z} for x, y, z in zip(xs, ys, zs, strict=True)]
    if not names:
        return [{} for _ in range(count)]
    return [dict(zip(names, values, strict=True)) for values in zip(*columns, strict=True)]


def _value(
    afters: list[pa.Array],
    missing: npt.NDArray[np.bool_],
    patches: dict[int, dict[int, Any]],
    message: int,
    column: int,
) -> Any:
    if message in patches.get(column, {}):
        return patches[column][message]
    if missing[message, column]:
        return UNAVAILABLE
    return afters[column][message].as_py()
