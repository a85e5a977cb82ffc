"""Spec 002: SinkUpsertMaterializer turns an out-of-order update stream into a primary-key sink's changes.

The spec's job joins s1 (id, level) with s2 (id, attr) on ``s1.level = s2.id`` and writes
(id, level, attr) into t1 with PRIMARY KEY(id). s1's row 1 goes from level 10 to level 20; the join is
shuffled by level, so its three events reach the sink in one of three orders.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

import pytest
from helpers import dele, ins, ua, ub
from helpers import materialize as fold_exactly
from hypothesis import given
from hypothesis import strategies as st

from cdcflow.core import (
    Change,
    ChangelogDataError,
    ChangelogValidationError,
    RowKind,
    UpsertMaterializer,
    materialize,
)

Row = dict[str, Any]
R10 = {"id": 1, "level": 10, "attr": "a1"}
R20 = {"id": 1, "level": 20, "attr": "b1"}
JOIN_UNIQUE_KEY = ["id", "level"]

ARRIVALS = {
    "(1) in order": [ins(**R10), ub(**R10), ua(**R20)],
    "(2) +U overtakes": [ua(**R20), ins(**R10), ub(**R10)],
    "(3) -U lags": [ins(**R10), ua(**R20), ub(**R10)],
}
MATERIALIZED = {
    "(1) in order": [ins(**R10), dele(**R10), ins(**R20)],
    # the removed row was the last one: the second last row is emitted again
    "(2) +U overtakes": [ins(**R20), ua(**R10), ua(**R20)],
    # the late -U removes a row the sink no longer shows: nothing to emit
    "(3) -U lags": [ins(**R10), ua(**R20)],
}


def sink_table(changes: Iterable[Change], key: Sequence[str] = ("id",)) -> dict[tuple[Any, ...], Row]:
    """An upsert sink: +I/+U upsert the row of their primary key, -U/-D delete it."""
    table: dict[tuple[Any, ...], Row] = {}
    for change in changes:
        pk = tuple(change.row[column] for column in key)
        if change.kind.is_retraction:
            table.pop(pk, None)
        else:
            table[pk] = change.row
    return table


def steps(
    materializer: UpsertMaterializer, changes: Iterable[Change]
) -> list[tuple[list[Row], Change | None]]:
    """Feed one primary key's changes through ``apply``: (live rows, emitted change) after each."""
    rows: list[Row] = []
    trace = []
    for change in changes:
        rows, out = materializer.apply(rows, change)
        trace.append((rows, out))
    return trace


# --- the spec's example -------------------------------------------------------------------------


@pytest.mark.parametrize("upsert_key", [None, JOIN_UNIQUE_KEY], ids=["no upsert key", "upsert key"])
@pytest.mark.parametrize("order", ARRIVALS)
def test_every_arrival_order_ends_with_level_20_in_the_sink(order: str, upsert_key: list[str] | None) -> None:
    emitted = list(materialize(ARRIVALS[order], key=["id"], upsert_key=upsert_key))

    assert emitted == MATERIALIZED[order]
    assert sink_table(emitted) == {(1,): R20}


@pytest.mark.parametrize("order", ["(2) +U overtakes", "(3) -U lags"])
def test_a_naive_upsert_sink_deletes_the_row_when_events_arrive_out_of_order(order: str) -> None:
    assert sink_table(ARRIVALS[order]) == {}


def test_a_naive_upsert_sink_is_right_only_when_events_arrive_in_order() -> None:
    assert sink_table(ARRIVALS["(1) in order"]) == {(1,): R20}


def test_the_state_is_the_list_of_live_rows_in_arrival_order() -> None:
    trace = steps(UpsertMaterializer(None), ARRIVALS["(2) +U overtakes"])

    assert trace == [
        ([R20], ins(**R20)),
        ([R20, R10], ua(**R10)),
        ([R20], ua(**R20)),
    ]


# --- matching by upsert key or by whole row -----------------------------------------------------


def test_with_an_upsert_key_a_retraction_matches_on_the_key_and_deletes_the_stored_row() -> None:
    key_only = {"id": 1, "level": 10, "attr": None}
    trace = steps(UpsertMaterializer(JOIN_UNIQUE_KEY), [ins(**R10), dele(**key_only)])

    assert trace[-1] == ([], dele(**R10))


def test_without_an_upsert_key_a_retraction_must_match_the_whole_row() -> None:
    unmatched: list[Change] = []
    materializer = UpsertMaterializer(None, on_unmatched=unmatched.append)
    partial = dele(id=1, level=10, attr=None)

    trace = steps(materializer, [ins(**R10), partial])

    assert trace[-1] == ([R10], None)
    assert materializer.unmatched == 1
    assert unmatched == [partial]


def test_without_an_upsert_key_equal_rows_are_counted_like_a_multiset() -> None:
    trace = steps(UpsertMaterializer(None), [ins(**R10), ins(**R10), dele(**R10), dele(**R10)])

    assert [out for _, out in trace] == [ins(**R10), ua(**R10), None, dele(**R10)]


def test_with_an_upsert_key_an_equal_key_replaces_instead_of_adding() -> None:
    trace = steps(UpsertMaterializer(JOIN_UNIQUE_KEY), [ins(**R10), ins(**R10), dele(**R10), dele(**R10)])

    assert [out for _, out in trace] == [ins(**R10), ua(**R10), dele(**R10), None]


def test_compare_columns_leave_other_columns_out_of_the_whole_row_match() -> None:
    seen = {**R10, "ingested_at": 100}
    retraction = dele(**{**R10, "ingested_at": 250})

    compared = UpsertMaterializer(None, compare_columns=["id", "level", "attr"])
    assert steps(compared, [ins(**seen), retraction])[-1] == ([], dele(**seen))

    whole_row = UpsertMaterializer(None)
    assert steps(whole_row, [ins(**seen), retraction])[-1] == ([seen], None)
    assert whole_row.unmatched == 1


def test_retract_unmatched_retracts_the_oldest_live_row_or_deletes_the_key() -> None:
    partial = dele(id=1, level=10, attr=None)
    materializer = UpsertMaterializer(None, retract_unmatched=True)

    single = steps(materializer, [ins(**R10), partial])
    older_first = steps(materializer, [ins(**R10), ua(**R20), ub(id=1, level=10, attr="a0")])
    nothing_live = steps(materializer, [partial])

    assert single[-1] == ([], dele(**R10))
    assert older_first[-1] == ([R20], None)
    assert nothing_live[-1] == ([], dele(id=1, level=10, attr=None))
    assert materializer.unmatched == 3


# --- retractions ---------------------------------------------------------------------------------


def test_an_unmatched_retraction_is_counted_reported_and_emits_nothing() -> None:
    reported: list[Change] = []
    materializer = UpsertMaterializer(JOIN_UNIQUE_KEY, on_unmatched=reported.append)

    rows, out = materializer.apply([R20], ub(**R10))

    assert (rows, out) == ([R20], None)
    assert materializer.unmatched == 1
    assert reported == [ub(**R10)]


def test_retracting_the_only_row_emits_a_delete() -> None:
    rows, out = UpsertMaterializer(None).apply([R10], ub(**R10))

    assert rows == []
    assert out == dele(**R10)


def test_retracting_a_row_that_is_not_the_last_emits_nothing() -> None:
    r30 = {"id": 1, "level": 30, "attr": "c1"}
    rows, out = UpsertMaterializer(None).apply([R10, R20, r30], ub(**R20))

    assert rows == [R10, r30]
    assert out is None


def test_apply_returns_new_state_and_leaves_the_given_list_alone() -> None:
    materializer = UpsertMaterializer(JOIN_UNIQUE_KEY)
    state = [R10, R20]

    added, _ = materializer.apply(state, ua(**{**R10, "attr": "a2"}))
    retracted, _ = materializer.apply(state, ub(**R20))

    assert state == [R10, R20]
    assert added is not state and retracted is not state


# --- updates of a live upsert key ----------------------------------------------------------------


def test_updating_the_only_row_emits_an_update_after() -> None:
    a2 = {**R10, "attr": "a2"}
    trace = steps(UpsertMaterializer(JOIN_UNIQUE_KEY), [ins(**R10), ua(**a2)])

    assert trace[-1] == ([a2], ua(**a2))


def test_updating_the_last_row_emits_it() -> None:
    b2 = {**R20, "attr": "b2"}
    trace = steps(UpsertMaterializer(JOIN_UNIQUE_KEY), [ins(**R10), ins(**R20), ua(**b2)])

    assert trace[-1] == ([R10, b2], ua(**b2))


def test_an_updated_row_moves_to_the_end_so_its_later_delete_reaches_the_sink() -> None:
    # Flink replaces the row in place: the sink shows a2, then the delete of a2 (not last) emits
    # nothing and the sink keeps a row that is no longer live.
    a2 = {**R10, "attr": "a2"}
    materializer = UpsertMaterializer(JOIN_UNIQUE_KEY)

    trace = steps(materializer, [ins(**R10), ins(**R20), ua(**a2), dele(**a2)])

    assert trace == [
        ([R10], ins(**R10)),
        ([R10, R20], ua(**R20)),
        ([R20, a2], ua(**a2)),
        ([R20], ua(**R20)),
    ]
    assert sink_table(out for _, out in trace if out is not None) == {(1,): R20}


# --- Flink's own harness cases (SinkUpsertMaterializerTest), sink key ``id``, upsert key ``k`` ----


def test_flinks_upsert_key_case_with_a_non_deterministic_column() -> None:
    def row(k: int, v: str) -> Row:
        return {"k": k, "id": 1, "v": v}

    trace = steps(
        UpsertMaterializer(["k"]),
        [
            ins(**row(1, "a1")),
            ua(**row(1, "a11")),
            ins(**row(3, "a3")),
            dele(**row(1, "a111")),
            dele(**row(3, "a33")),
        ],
    )

    assert [out for _, out in trace] == [
        ins(**row(1, "a1")),
        ua(**row(1, "a11")),
        ua(**row(3, "a3")),
        None,
        dele(**row(3, "a3")),  # Flink emits the retraction's image, -D(3, 1, a33)
    ]


def _kv(k: int) -> Row:
    return {"k": k, "id": 1, "v": f"a{k}"}


@pytest.mark.parametrize("upsert_key", [None, ["k"]], ids=["no upsert key", "upsert key"])
@pytest.mark.parametrize(
    ("retract_order", "expected"),
    [
        ((1, 2, 3), [None, None, dele(**_kv(3))]),
        ((2, 1, 3), [None, None, dele(**_kv(3))]),
        ((3, 2, 1), [ua(**_kv(2)), ua(**_kv(1)), dele(**_kv(1))]),
        ((1, 3, 2), [None, ua(**_kv(2)), dele(**_kv(2))]),
        ((2, 3, 1), [None, ua(**_kv(1)), dele(**_kv(1))]),
        ((3, 1, 2), [ua(**_kv(2)), None, dele(**_kv(2))]),
    ],
)
def test_flinks_retraction_cases(
    retract_order: tuple[int, ...], expected: list[Change | None], upsert_key: list[str] | None
) -> None:
    inserts = [ins(**_kv(k)) for k in (1, 2, 3)]
    trace = steps(UpsertMaterializer(upsert_key), inserts + [dele(**_kv(k)) for k in retract_order])

    assert [out for _, out in trace] == [ins(**_kv(1)), ua(**_kv(2)), ua(**_kv(3)), *expected]


# --- the materialize() driver --------------------------------------------------------------------


def test_materialize_keeps_primary_keys_apart() -> None:
    r2 = {"id": 2, "level": 10, "attr": "a1"}
    changes = [ins(**R10), ins(**r2), ub(**R10), ua(**R20), ub(**r2)]

    emitted = list(materialize(changes, key=["id"], upsert_key=None))

    assert emitted == [ins(**R10), ins(**r2), dele(**R10), ins(**R20), dele(**r2)]


def test_materialize_rejects_a_change_without_its_primary_key() -> None:
    with pytest.raises(ChangelogDataError, match="record #1, field 'id'"):
        list(materialize([ins(**R10), ins(level=10, attr="a1")], key=["id"], upsert_key=None))


def test_materialize_needs_a_primary_key() -> None:
    with pytest.raises(ChangelogValidationError, match="primary key"):
        list(materialize([ins(**R10)], key=[], upsert_key=None))


# --- properties: any arrival order that keeps each upsert key's (or row's) own order ------------

LEVELS = st.integers(0, 3)
ATTRS = st.sampled_from("ab")


def identity_of(upsert_key: Sequence[str] | None) -> Callable[[Row], Hashable]:
    """What the materializer matches rows on: the upsert key, else the whole row."""
    if upsert_key:
        return lambda row: tuple(row[column] for column in upsert_key)
    return lambda row: tuple(sorted(row.items()))


def interleave(data: st.DataObject, groups: Iterable[list[Change]]) -> list[Change]:
    """A random merge of ``groups`` that keeps the order within each group."""
    queues = [list(group) for group in groups if group]
    merged = []
    while queues:
        index = data.draw(st.integers(0, len(queues) - 1))
        merged.append(queues[index].pop(0))
        if not queues[index]:
            del queues[index]
    return merged


def split_by(identity: Callable[[Row], Hashable], changes: list[Change]) -> list[list[Change]]:
    groups: dict[Hashable, list[Change]] = {}
    for change in changes:
        groups.setdefault(identity(change.row), []).append(change)
    return list(groups.values())


@st.composite
def sequential_histories(draw: st.DrawFn, with_upsert_key: bool) -> list[Change]:
    """What the join emits for id 1 in its true order: one live row at a time (it is the sink's key).

    Each life is a row inserted, updated a few times and deleted; only the last life may stay live.
    Without an upsert key updates are -U/+U pairs; with one they may also be a bare +U, and a delete
    may carry only the key columns.
    """
    lives = draw(st.lists(st.tuples(LEVELS, st.lists(ATTRS, min_size=1, max_size=3)), min_size=1, max_size=4))
    stays_live = draw(st.booleans())
    history: list[Change] = []
    for number, (level, attrs) in enumerate(lives):
        current = {"id": 1, "level": level, "attr": attrs[0]}
        history.append(ins(**current))
        for attr in attrs[1:]:
            if not with_upsert_key or draw(st.booleans()):
                history.append(ub(**current))
            current = {**current, "attr": attr}
            history.append(ua(**current))
        if number < len(lives) - 1 or not stays_live:
            image = {**current, "attr": None} if with_upsert_key and draw(st.booleans()) else current
            history.append(Change(draw(st.sampled_from([RowKind.DELETE, RowKind.UPDATE_BEFORE])), image))
    return history


@pytest.mark.parametrize("upsert_key", [None, JOIN_UNIQUE_KEY], ids=["no upsert key", "upsert key"])
@given(data=st.data())
def test_any_allowed_arrival_order_ends_like_the_true_order(
    upsert_key: list[str] | None, data: st.DataObject
) -> None:
    history = data.draw(sequential_histories(with_upsert_key=upsert_key is not None))
    arrival = interleave(data, split_by(identity_of(upsert_key), history))
    unmatched: list[Change] = []

    emitted = list(materialize(arrival, key=["id"], upsert_key=upsert_key, on_unmatched=unmatched.append))

    assert sink_table(emitted) == sink_table(history)
    assert unmatched == []


@st.composite
def per_identity_histories(draw: st.DrawFn, with_upsert_key: bool) -> list[list[Change]]:
    """Independent histories, one per upsert key (or per whole row), with several rows live at once.

    That breaks the sink key (a real conflict, or a moment in the middle of the stream): no single
    true row exists, so only what the materializer promises can be checked.
    """
    groups = []
    for level in draw(st.sets(LEVELS, min_size=1)):
        if with_upsert_key:
            groups.append(_upsert_key_history(draw, level))
        else:
            for attr in "ab":
                groups.append(_whole_row_history(draw, {"id": 1, "level": level, "attr": attr}))
    return groups


def _upsert_key_history(draw: st.DrawFn, level: int) -> list[Change]:
    changes: list[Change] = []
    current: Row | None = None
    for action, attr in draw(st.lists(st.tuples(st.sampled_from(["+U", "-U+U", "-D"]), ATTRS), max_size=5)):
        new = {"id": 1, "level": level, "attr": attr}
        if current is None:
            changes.append(ins(**new))
        elif action == "-D":
            changes.append(dele(**current))
            current = None
            continue
        elif action == "-U+U":
            changes += [ub(**current), ua(**new)]
        else:
            changes.append(ua(**new))
        current = new
    return changes


def _whole_row_history(draw: st.DrawFn, row: Row) -> list[Change]:
    changes: list[Change] = []
    count = 0
    for add, kind_of_add, kind_of_retract in draw(
        st.lists(st.tuples(st.booleans(), st.sampled_from("IU"), st.sampled_from("UD")), max_size=5)
    ):
        if add or count == 0:
            changes.append(ins(**row) if kind_of_add == "I" else ua(**row))
            count += 1
        else:
            changes.append(ub(**row) if kind_of_retract == "U" else dele(**row))
            count -= 1
    return changes


@pytest.mark.parametrize("upsert_key", [None, JOIN_UNIQUE_KEY], ids=["no upsert key", "upsert key"])
@given(data=st.data())
def test_the_sink_always_holds_the_latest_added_live_row(
    upsert_key: list[str] | None, data: st.DataObject
) -> None:
    identity = identity_of(upsert_key)
    arrival = interleave(data, data.draw(per_identity_histories(with_upsert_key=upsert_key is not None)))
    materializer = UpsertMaterializer(upsert_key)
    rows: list[Row] = []
    emitted: list[Change] = []
    live: Counter[Hashable] = Counter()
    last_add: dict[Hashable, tuple[int, Row]] = {}
    for position, change in enumerate(arrival):
        rows, out = materializer.apply(rows, change)
        if out is not None:
            emitted.append(out)
        key = identity(change.row)
        if change.kind.is_retraction:
            live[key] -= 1
        else:
            live[key] = 1 if upsert_key else live[key] + 1
            last_add[key] = (position, change.row)
        # the sink holds the last live row, and every -D retracts exactly the row it holds
        assert fold_exactly(emitted) == rows[-1:]

    live_rows = [row for _, row in sorted(last_add[key] for key, count in live.items() if count > 0)]
    table = list(sink_table(emitted).values())
    assert bool(table) == bool(live_rows)
    assert all(row in live_rows for row in table)
    assert table == live_rows[-1:]  # the live row whose latest version arrived last
    assert materializer.unmatched == 0
