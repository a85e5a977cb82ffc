"""Rows matched by key (hash lookups for one key column, a join for several) and grouped by key (integers by
their offset, other values by a dictionary) against Python dicts and sets."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow.connectors.lakehouse.delta.batch import (
    group_ids,
    id_bound,
    positions_in,
    rows_with_keys,
    take_or_null,
)

INTS = st.integers(min_value=-3, max_value=6)
TEXTS = st.sampled_from(["a", "b", "é", "", "long key " * 3])
EXTREMES = st.sampled_from([-(2**63), -1, 0, 2**63 - 1])
UNSIGNED = st.sampled_from([0, 1, 2**63, 2**64 - 2, 2**64 - 1])
SHAPES = {
    "int": (["id"], st.tuples(INTS)),
    "string": (["code"], st.tuples(TEXTS)),
    "composite": (["id", "code"], st.tuples(INTS, TEXTS)),
    "nullable int": (["id"], st.tuples(st.one_of(INTS, st.none()))),
    "wide int": (["wide"], st.tuples(st.one_of(INTS, EXTREMES))),
    "uint64": (["unsigned"], st.tuples(UNSIGNED)),
    "composite of ints": (
        ["id", "wide", "unsigned"],
        st.tuples(INTS, EXTREMES, UNSIGNED),
    ),
}
#: Integers whose offsets are codes: four such columns' combined codes outgrow an int64 unless renumbered.
SPREAD = st.one_of(st.sampled_from([0, 1, 60_000]), st.none())
BATCH_TYPES = {
    "id": pa.int32(),
    "code": pa.string(),
    "wide": pa.int64(),
    "unsigned": pa.uint64(),
    **{f"spread{i}": pa.int64() for i in range(4)},
}


def _table(keys: list[str], values: list[tuple[Any, ...]], types: dict[str, pa.DataType]) -> pa.Table:
    return pa.table({name: pa.array([v[i] for v in values], types[name]) for i, name in enumerate(keys)})


@settings(max_examples=120, deadline=None)
@given(
    shape=st.sampled_from(sorted(SHAPES)),
    data=st.data(),
)
def test_group_ids_and_positions_agree_with_dicts(shape: str, data: st.DataObject) -> None:
    keys, values = SHAPES[shape]
    rows = data.draw(st.lists(values, max_size=40))
    known = data.draw(st.lists(values, max_size=20, unique=True))
    batch = _table(keys, rows, BATCH_TYPES)
    # The key state reads strings as views and integers wider: positions_in casts them to the batch's.
    state = _table(keys, known, {**BATCH_TYPES, "id": pa.int64(), "code": pa.string_view()})

    ids = group_ids(batch, keys)
    assert len(ids) == len(rows)
    assert ids.min(initial=0) >= 0
    assert ids.max(initial=0) < id_bound(len(rows)), "ids index a small array"
    first: dict[tuple[Any, ...], int] = {}
    for row, kid in zip(rows, ids.tolist(), strict=True):
        assert first.setdefault(row, kid) == kid, "equal keys, equal ids"
    assert len(set(first.values())) == len(first), "different keys, different ids"

    where = {value: at for at, value in enumerate(known)}
    assert positions_in(batch, state, keys).tolist() == [where.get(row, -1) for row in rows]
    # The key state's rows (as a read gives them) of a batch's keys (which repeat).
    read = _table(keys, known, {**BATCH_TYPES, "id": pa.int64()})
    kept = rows_with_keys(read, batch, keys).to_pylist()
    assert [tuple(row[k] for k in keys) for row in kept] == [value for value in known if value in set(rows)]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(INTS, st.none()), EXTREMES, st.one_of(TEXTS, st.none()), SPREAD, SPREAD, SPREAD, SPREAD
        ),
        max_size=40,
    )
)
def test_group_ids_of_several_columns_take_a_null_for_a_value_of_its_own(rows: list[tuple[Any, ...]]) -> None:
    keys = ["id", "wide", "code", "spread0", "spread1", "spread2", "spread3"]
    ids = group_ids(_table(keys, rows, BATCH_TYPES), keys)
    assert ids.max(initial=0) < id_bound(len(rows))
    first: dict[tuple[Any, ...], int] = {}
    for row, kid in zip(rows, ids.tolist(), strict=True):
        assert first.setdefault(row, kid) == kid
    assert len(set(first.values())) == len(first)


def test_take_or_null_leaves_unmatched_rows_null() -> None:
    column = pa.chunked_array(
        [pa.array([b"a", b"b"], pa.large_binary()), pa.array([b"c"], pa.large_binary())]
    )
    assert take_or_null(column, np.array([2, -1, 0, -1])).to_pylist() == [b"c", None, b"a", None]
