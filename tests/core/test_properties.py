"""Properties of the engine over random changelogs (spec 4.5 and the upsert → retract conversion)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow import Change, RowKind, from_changelog, to_changelog

INSERT, UB, UA, DELETE = RowKind.INSERT, RowKind.UPDATE_BEFORE, RowKind.UPDATE_AFTER, RowKind.DELETE
DEBEZIUM_FROM = {"c": "INSERT", "u": "UPDATE_BEFORE, UPDATE_AFTER", "d": "DELETE"}
DEBEZIUM_TO = {"INSERT": "c", "UPDATE_BEFORE, UPDATE_AFTER": "u", "DELETE": "d"}

values = st.one_of(st.none(), st.integers(-5, 5), st.text(max_size=3))
# One step per draw: which key, what happens to it, and the new value if it lives on.
steps = st.lists(st.tuples(st.integers(0, 4), st.sampled_from(["upsert", "delete"]), values), max_size=40)


def _valid_changelog(raw: list[tuple[int, str, Any]], *, retract: bool) -> list[Change]:
    """A changelog a table could really have produced: keys inserted before updated or deleted."""
    table: dict[int, dict[str, Any]] = {}
    changes: list[Change] = []
    for key, action, value in raw:
        row = {"id": key, "v": value}
        if action == "upsert" and key not in table:
            changes.append(Change(INSERT, row))
        elif action == "upsert":
            if retract:
                changes.append(Change(UB, table[key]))
            changes.append(Change(UA, row))
        elif key in table:
            changes.append(Change(DELETE, table.pop(key)))
            continue
        else:
            continue
        table[key] = row
    return changes


@given(steps)
def test_from_to_round_trip_of_an_upsert_changelog_with_defaults(raw: list[tuple[int, str, Any]]) -> None:
    changelog = _valid_changelog(raw, retract=False)
    assert list(from_changelog(to_changelog(changelog))) == changelog


@given(steps)
def test_from_to_round_trip_of_a_retract_changelog_as_debezium(raw: list[tuple[int, str, Any]]) -> None:
    changelog = _valid_changelog(raw, retract=True)
    envelopes = list(
        to_changelog(
            changelog,
            before="before",
            after="after",
            partition_by="id",
            produces_full_deletes=True,
            op_mapping=DEBEZIUM_TO,
        )
    )
    assert len(envelopes) == sum(1 for c in changelog if c.kind is not UB)
    back = from_changelog(envelopes, before="before", after="after", op_mapping=DEBEZIUM_FROM)
    assert list(back) == changelog


flat_records = st.lists(
    st.fixed_dictionaries(
        {"op": st.sampled_from(["INSERT", "UPDATE_AFTER", "DELETE"]), "id": st.integers(0, 4), "v": values}
    ),
    max_size=40,
)


@given(flat_records)
def test_to_from_round_trip_of_flat_records_with_defaults(records: list[dict[str, Any]]) -> None:
    assert list(to_changelog(from_changelog(records))) == records


debezium_records = st.lists(
    st.one_of(
        st.builds(lambda a: {"op": "c", "before": None, "after": a}, st.fixed_dictionaries({"id": values})),
        st.builds(
            lambda b, a: {"op": "u", "before": b, "after": a},
            st.fixed_dictionaries({"id": values}),
            st.fixed_dictionaries({"id": values}),
        ),
        st.builds(lambda b: {"op": "d", "before": b, "after": None}, st.fixed_dictionaries({"id": values})),
    ),
    max_size=30,
)


@given(debezium_records)
def test_to_from_round_trip_of_debezium_envelopes(records: list[dict[str, Any]]) -> None:
    changes = from_changelog(records, before="before", after="after", op_mapping=DEBEZIUM_FROM)
    out = to_changelog(
        changes, before="before", after="after", produces_full_deletes=True, op_mapping=DEBEZIUM_TO
    )
    assert list(out) == records


def _materialize_upsert(records: list[dict[str, Any]]) -> Counter[tuple[Any, ...]]:
    table: dict[Any, tuple[Any, ...]] = {}
    for record in records:
        if record["op"] == "delete":
            table.pop(record["id"], None)
        else:
            table[record["id"]] = (record["id"], record["v"])
    return Counter(table.values())


def _materialize_retract(changes: list[Change]) -> Counter[tuple[Any, ...]]:
    table: Counter[tuple[Any, ...]] = Counter()
    for change in changes:
        row = (change.row["id"], change.row["v"])
        if change.kind.is_retraction:
            assert table[row] > 0, f"{change} retracts a row the table does not hold"
            table[row] -= 1
        else:
            table[row] += 1
    return +table


@settings(max_examples=200)
@given(steps)
def test_upsert_to_retract_materializes_to_the_same_table(raw: list[tuple[int, str, Any]]) -> None:
    live: dict[int, Any] = {}
    records = []
    for key, action, value in raw:
        if action == "delete":
            if key not in live:
                continue  # an upsert source deletes only what it holds; its deletes carry the full row
            records.append({"op": "delete", "id": key, "v": live.pop(key)})
        else:
            live[key] = value
            records.append({"op": "upsert", "id": key, "v": value})
    retract = list(
        from_changelog(
            records,
            partition_by="id",
            state_ttl=0,
            consume_full_deletes=True,
            op_mapping={"upsert": "INSERT, UPDATE_BEFORE, UPDATE_AFTER", "delete": "DELETE"},
        )
    )
    assert _materialize_retract(retract) == _materialize_upsert(records)
    assert {c.kind for c in retract} <= {INSERT, UB, UA, DELETE}
