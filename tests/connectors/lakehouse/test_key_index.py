"""Rows matched by key (hash lookups for one key column, a join for several) against Python dicts and sets."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow.connectors.lakehouse.delta.batch import group_ids, positions_in, rows_with_keys, take_or_null

INTS = st.integers(min_value=-3, max_value=6)
TEXTS = st.sampled_from(["a", "b", "é", "", "long key " * 3])
SHAPES = {
    "int": (["id"], st.tuples(INTS)),
    "string": (["code"], st.tuples(TEXTS)),
    "composite": (["id", "code"], st.tuples(INTS, TEXTS)),
}


def _table(keys: list[str], values: list[tuple[Any, ...]], types: dict[str, pa.DataType]) -> pa.Table:
    return pa.table({name: pa.array([v[i] for v in values], types[name]) for i, name in enumerate(keys)})


@settings(max_examples=60, deadline=None)
@given(
    shape=st.sampled_from(sorted(SHAPES)),
    data=st.data(),
)
def test_group_ids_and_positions_agree_with_dicts(shape: str, data: st.DataObject) -> None:
    keys, values = SHAPES[shape]
    rows = data.draw(st.lists(values, max_size=40))
    known = data.draw(st.lists(values, max_size=20, unique=True))
    batch = _table(keys, rows, {"id": pa.int32(), "code": pa.string()})
    # The key state reads strings as views and integers wider: positions_in casts them to the batch's.
    state = _table(keys, known, {"id": pa.int64(), "code": pa.string_view()})

    ids = group_ids(batch, keys)
    assert len(ids) == len(rows)
    first: dict[tuple[Any, ...], int] = {}
    for row, kid in zip(rows, ids.tolist(), strict=True):
        assert first.setdefault(row, kid) == kid, "equal keys, equal ids"
    assert len(set(first.values())) == len(first), "different keys, different ids"

    where = {value: at for at, value in enumerate(known)}
    assert positions_in(batch, state, keys).tolist() == [where.get(row, -1) for row in rows]
    # The key state's rows (as a read gives them) of a batch's keys (which repeat).
    read = _table(keys, known, {"id": pa.int64(), "code": pa.string()})
    kept = rows_with_keys(read, batch, keys).to_pylist()
    assert [tuple(row[k] for k in keys) for row in kept] == [value for value in known if value in set(rows)]


def test_take_or_null_leaves_unmatched_rows_null() -> None:
    column = pa.chunked_array(
        [pa.array([b"a", b"b"], pa.large_binary()), pa.array([b"c"], pa.large_binary())]
    )
    assert take_or_null(column, np.array([2, -1, 0, -1])).to_pylist() == [b"c", None, b"a", None]
