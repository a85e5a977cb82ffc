"""Unchanged-TOAST values of a columnar block filled per Kafka key (``unavailable-values=fill``).

The per-record decoder keeps each key's last after image (:class:`.envelope.ChangeBuilder`'s LRU state)
and fills a placeholder the event's before image lacks from it. The columnar path shares that state:
a block's placeholders (rare) are filled from the key's previous message in the block, else from the
state, walking only the messages that carry one; the state then takes each key's last message of the
block (a delete drops the key), in the order of those messages, as the per-record decoder leaves it.
Only text columns are kept for a key: they are the ones a placeholder can stand in for here.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

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
    column ``c`` is a placeholder its before image did not fill; ``deletes``: which messages are deletes."""
    patches: dict[int, dict[int, Any]] = {}  # column -> message -> value
    last_of: dict[StateKey, int] = {}
    wanting: npt.NDArray[np.bool_] = np.asarray(missing.any(axis=1), dtype=np.bool_)
    filled = 0
    for message, key in enumerate(keys):
        if key is None:
            continue
        if wanting[message]:
            previous = last_of.get(key)
            stored = images.get(key) if previous is None else None
            for column in np.flatnonzero(missing[message]).tolist():
                if previous is None:
                    value = UNAVAILABLE if stored is None else stored.get(names[column], UNAVAILABLE)
                elif deletes[previous]:
                    value = UNAVAILABLE  # the delete dropped the key's state
                else:
                    value = _value(afters, missing, patches, previous, column)
                if value is not UNAVAILABLE:
                    patches.setdefault(column, {})[message] = value
                    missing[message, column] = False
                    filled += 1
        last_of[key] = message
    patched = list(afters)
    for column, values in patches.items():
        mask = np.zeros(len(afters[column]), dtype=np.bool_)
        order = sorted(values)
        mask[order] = True
        replacements = pa.array([values[m] for m in order], afters[column].type)
        patched[column] = pc.replace_with_mask(afters[column], pa.array(mask), replacements)

    def commit() -> None:
        text = [c for c, is_text in enumerate(checked) if is_text]
        kept = [k for k, _ in sorted(last_of.items(), key=lambda item: item[1])]
        at = pa.array([last_of[k] for k in kept], pa.int64())
        columns = {c: patched[c].take(at).to_pylist() for c in text}
        for index, key in enumerate(kept):
            message = last_of[key]
            if deletes[message]:
                images.pop(key)
                continue
            images.put(
                key,
                {names[c]: UNAVAILABLE if missing[message, c] else columns[c][index] for c in text},
            )

    return KeyedFill(patched, missing, filled, commit)


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
