"""The upsert key of a row: the value of its ``partition_by`` column, a tuple for several."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

from cdcflow.core.errors import ChangelogDataError, NullKeyError

GLOBAL_KEY: tuple[()] = ()
"""The one key of a conversion without ``partition_by`` (the spec's parallelism of 1)."""


def key_of(row: Mapping[str, Any], columns: tuple[str, ...], record_index: int) -> Hashable:
    """``row``'s key; a NULL or missing key column fails (spec 4.3.5)."""
    if len(columns) == 1:
        value = row.get(columns[0])
        if value is None or type(value) not in _PLAIN_KEY_TYPES:
            _check(value, columns[0], columns, record_index)
        return value
    values = tuple(row.get(column) for column in columns)
    for column, value in zip(columns, values, strict=True):
        _check(value, column, columns, record_index)
    return values


_PLAIN_KEY_TYPES = frozenset({int, str})


def _check(value: Any, column: str, columns: tuple[str, ...], record_index: int) -> None:
    if value is None:
        raise NullKeyError(
            "the upsert key column is NULL (or missing): updates and deletes need a key to find "
            f"their row; check partition_by={list(columns)} against the input's columns",
            record_index=record_index,
            field=column,
        )
    try:
        hash(value)
    except TypeError:
        raise ChangelogDataError(
            f"the key value {value!r} is not hashable: partition_by columns must hold scalar values",
            record_index=record_index,
            field=column,
        ) from None
