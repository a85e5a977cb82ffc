"""Values a change does not carry (unchanged TOAST), primary-key changes and absent columns.

Each test reads the Delta table back after several batches, restarts (a new applier over the same
table and state) and replays (the same batch id again), where the defects of issue 11 lived.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from state_crash import crash_before_next_state_commit
from test_apply import KEY, ROW_KIND, rows

from cdcflow.connectors.lakehouse.delta.apply import DeltaChangeApplier
from cdcflow.connectors.lakehouse.delta.options import ApplyOptions, Materialize
from cdcflow.connectors.lakehouse.delta.state_cache import CachedState
from cdcflow.connectors.lakehouse.delta.tables import RsTable

UNAVAILABLE, OLD_KEY, NEW_KEY = "unavailable_columns", "old_key", "new_key"
SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("id", pa.int64()),
        ("name", pa.string()),
        ("body", pa.string()),
        ("seq", pa.int64()),
        (ROW_KIND, pa.string()),
        (UNAVAILABLE, pa.list_(pa.string())),
        (OLD_KEY, pa.string()),
        (NEW_KEY, pa.string()),
    ]
)
COORDINATES = ("topic", "partition", "offset", "seq")
OFFSETS = iter(range(10**6))


def change(kind: str, *, unavailable: list[str] | None = None, **row: Any) -> dict[str, Any]:
    return {
        "topic": "t",
        "partition": 0,
        "offset": next(OFFSETS),
        **row,
        ROW_KIND: kind,
        UNAVAILABLE: unavailable,
    }


def table(*changes: dict[str, Any]) -> pa.Table:
    return pa.Table.from_pylist(list(changes), schema=SCHEMA)


def applier(tmp_path: Path, **options: Any) -> DeltaChangeApplier:
    opts = ApplyOptions(
        key=KEY,
        upsert_key=KEY,
        exclude=COORDINATES,
        unavailable_column=UNAVAILABLE,
        old_key_column=OLD_KEY,
        new_key_column=NEW_KEY,
        **options,
    )
    state = str(tmp_path / "state") if opts.stateful else None
    return DeltaChangeApplier(str(tmp_path / "table"), opts, app_id="app", state_path=state)


MODES = {"sequence_by": {"sequence_by": "seq"}, "arrival order": {}}


# --- unavailable columns ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_an_unavailable_column_keeps_the_value_of_an_earlier_batch(tmp_path: Path, mode: str) -> None:
    sink = applier(tmp_path, **MODES[mode])
    sink.apply(table(change("+I", id=1, name="a", body="toast", seq=1)), 0)

    sink.apply(table(change("+U", id=1, name="b", body=None, seq=2, unavailable=["body"])), 1)
    restarted = applier(tmp_path, **MODES[mode])
    applied = restarted.apply(table(change("+U", id=1, name="c", body=None, seq=3, unavailable=["body"])), 2)

    assert rows(tmp_path / "table") == [{"id": 1, "name": "c", "body": "toast"}]
    assert applied.unavailable_unfilled == 0
    assert UNAVAILABLE not in DeltaTable(str(tmp_path / "table")).schema().to_arrow().names


def test_an_unavailable_column_takes_the_latest_earlier_change_of_the_batch(tmp_path: Path) -> None:
    sink = applier(tmp_path, sequence_by="seq")
    sink.apply(
        table(change("+I", id=1, name="a", body="v1", seq=1), change("+I", id=2, name="x", body="w1", seq=1)),
        0,
    )

    applied = sink.apply(
        table(
            # arrival order is not sequence order: seq 4 lacks body, the latest earlier change is seq 3
            change("+U", id=1, name="d", body=None, seq=4, unavailable=["body"]),
            change("+U", id=1, name="b", body="v2", seq=2),
            change("+U", id=1, name="c", body=None, seq=3, unavailable=["body", "name"]),
            # key 2: no earlier change in the batch has it either: the table's value
            change("+U", id=2, name="y", body=None, seq=2, unavailable=["body"]),
            change("+U", id=2, name="z", body=None, seq=3, unavailable=["body"]),
        ),
        1,
    )

    assert rows(tmp_path / "table") == [
        {"id": 1, "name": "d", "body": "v2"},
        {"id": 2, "name": "z", "body": "w1"},
    ]
    assert applied.unavailable_unfilled == 0


def test_a_value_with_no_earlier_image_lands_null_counted_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sink = applier(tmp_path)
    sink.apply(table(change("+I", id=1, name="a", body="v1")), 0)

    with caplog.at_level(logging.WARNING):
        applied = sink.apply(
            table(
                change("+U", id=2, name="new", body=None, unavailable=["body"]),  # not in the table
                change("-D", id=1),
                change("+I", id=1, name="again", body=None, unavailable=["body"]),  # after a delete
            ),
            1,
        )

    assert rows(tmp_path / "table") == [
        {"id": 1, "name": "again", "body": None},
        {"id": 2, "name": "new", "body": None},
    ]
    assert applied.unavailable_unfilled == 2
    assert "t/0@" in caplog.text and "(body)" in caplog.text


def test_a_replayed_batch_with_unavailable_columns_is_applied_once(tmp_path: Path) -> None:
    sink = applier(tmp_path, sequence_by="seq")
    sink.apply(table(change("+I", id=1, name="a", body="toast", seq=1)), 0)
    update = table(change("+U", id=1, name="b", body=None, seq=2, unavailable=["body"]))
    sink.apply(update, 1)

    replay = applier(tmp_path, sequence_by="seq").apply(update, 1)

    assert replay.skipped
    assert rows(tmp_path / "table") == [{"id": 1, "name": "b", "body": "toast"}]


# --- primary-key changes ----------------------------------------------------------------------------


def delete_old(seq: int = 5) -> dict[str, Any]:
    return {**change("-D", id=1, seq=seq), NEW_KEY: '{"id":2}'}


def create_new(seq: int = 5) -> dict[str, Any]:
    return {**change("+I", id=2, name="a", body=None, seq=seq, unavailable=["body"]), OLD_KEY: '{"id": 1}'}


SPLITS: dict[str, Callable[[], list[list[dict[str, Any]]]]] = {
    "one batch, delete first": lambda: [[delete_old(), create_new()]],
    "one batch, create first": lambda: [[create_new(), delete_old()]],
    "delete in an earlier batch": lambda: [[delete_old()], [create_new()]],
    "create in an earlier batch": lambda: [[create_new()], [delete_old()]],
    "delete earlier, batches between": lambda: [[delete_old()], [change("+I", id=7, seq=6)], [create_new()]],
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("split", SPLITS)
def test_a_primary_key_change_carries_the_old_row_whatever_the_batches(
    tmp_path: Path, split: str, mode: str
) -> None:
    applier(tmp_path, **MODES[mode]).apply(table(change("+I", id=1, name="a", body="toast", seq=1)), 0)

    results = []
    for batch_id, changes in enumerate(SPLITS[split](), start=1):
        # a restart before each batch, and each batch replayed once
        results.append(applier(tmp_path, **MODES[mode]).apply(table(*changes), batch_id))
        replay = applier(tmp_path, **MODES[mode]).apply(table(*changes), batch_id)
        assert replay.skipped or replay.table_version is None

    got = [r for r in rows(tmp_path / "table") if r["id"] != 7]
    assert got == [{"id": 2, "name": "a", "body": "toast"}]
    assert sum(r.unavailable_unfilled for r in results) == 0
    # no carry or claim is left behind once both halves landed
    if DeltaTable.is_deltatable(str(tmp_path / "state")):
        state = DeltaTable(str(tmp_path / "state")).to_pyarrow_table().to_pylist()
        assert [s for s in state if s["_cdcflow_slot"] < -1] == []


def test_the_key_state_is_read_once_a_batch_with_the_keys_its_key_changes_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The walk's look-ups of the new key a delete names (outside its batch) and of the batch's own keys
    are answered from the one read of the key state the batch starts with."""
    reads: list[str] = []
    for handle in (RsTable, CachedState):  # the key state is read from the table or kept in memory
        read_rows = handle.rows_of_keys

        def counted(self: Any, *args: Any, read_rows: Any = read_rows, **kwargs: Any) -> pa.Table:
            reads.append(self.path)
            return read_rows(self, *args, **kwargs)

        monkeypatch.setattr(handle, "rows_of_keys", counted)
    state = str(tmp_path / "state")
    applier(tmp_path, sequence_by="seq").apply(table(change("+I", id=1, name="a", body="toast", seq=1)), 0)
    for batch_id, changes in enumerate([[delete_old()], [create_new()]], start=1):
        reads.clear()
        applier(tmp_path, sequence_by="seq").apply(table(*changes), batch_id)
        assert reads.count(state) == 1, f"batch {batch_id}: {reads}"
    assert rows(tmp_path / "table") == [{"id": 2, "name": "a", "body": "toast"}]


def test_a_key_change_takes_the_old_keys_latest_change_of_the_batch(tmp_path: Path) -> None:
    sink = applier(tmp_path, sequence_by="seq")
    sink.apply(table(change("+I", id=1, name="a", body="v1", seq=1)), 0)

    sink.apply(table(change("+U", id=1, name="a", body="v2", seq=2), delete_old(seq=3)), 1)
    sink.apply(table(create_new(seq=3)), 2)

    assert rows(tmp_path / "table") == [{"id": 2, "name": "a", "body": "v2"}]


def test_a_create_first_takes_the_old_keys_change_that_arrives_after_it_in_the_batch(tmp_path: Path) -> None:
    """Another partition: the old key's last update (made before the key change) arrives after the
    create in the batch; its delete comes in the next batch."""
    sink = applier(tmp_path)
    sink.apply(table(change("+I", id=1, name="a", body="v1")), 0)

    sink.apply(table(create_new(), change("+U", id=1, name="a", body="v2")), 1)
    sink.apply(table(delete_old()), 2)

    assert rows(tmp_path / "table") == [{"id": 2, "name": "a", "body": "v2"}]


def test_a_key_change_whose_delete_crashed_before_the_state_commit_keeps_the_old_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The replay finds the target commit landed (id 1 already deleted): it must read the old row as
    the first run did, from the table's version before that commit."""
    sink = applier(tmp_path)
    sink.apply(table(change("+I", id=1, name="a", body="toast")), 0)
    crash_before_next_state_commit(monkeypatch)
    with pytest.raises(RuntimeError, match="state commit"):
        sink.apply(table(delete_old()), 1)
    assert rows(tmp_path / "table") == []

    applier(tmp_path).apply(table(delete_old()), 1)
    applier(tmp_path).apply(table(create_new()), 2)

    assert rows(tmp_path / "table") == [{"id": 2, "name": "a", "body": "toast"}]


def test_a_key_change_under_materialization(tmp_path: Path) -> None:
    sink = applier(tmp_path, materialize=Materialize.FORCE)
    sink.apply(table(change("+I", id=1, name="a", body="toast")), 0)

    sink.apply(table(delete_old()), 1)
    sink.apply(table(create_new()), 2)
    sink.apply(table(change("+U", id=2, name="b", body=None, unavailable=["body"])), 3)

    assert rows(tmp_path / "table") == [{"id": 2, "name": "b", "body": "toast"}]


def test_key_links_need_a_state_path(tmp_path: Path) -> None:
    from cdcflow.connectors.errors import ConnectorOptionError

    options = ApplyOptions(key=KEY, upsert_key=KEY, old_key_column=OLD_KEY)
    with pytest.raises(ConnectorOptionError, match="state_path"):
        DeltaChangeApplier(str(tmp_path / "t"), options, app_id="app")


# --- absent columns ---------------------------------------------------------------------------------


def test_a_column_absent_from_a_batch_keeps_the_tables_value(tmp_path: Path) -> None:
    wide = pa.schema(
        [("id", pa.int64()), ("name", pa.string()), ("color", pa.string()), (ROW_KIND, pa.string())]
    )
    narrow = pa.schema([("id", pa.int64()), ("name", pa.string()), (ROW_KIND, pa.string())])
    options = ApplyOptions(key=KEY, upsert_key=KEY)
    sink = DeltaChangeApplier(str(tmp_path / "table"), options, app_id="app")
    sink.apply(pa.Table.from_pylist([{"id": 1, "name": "a", "color": "red", ROW_KIND: "+I"}], schema=wide), 0)

    sink.apply(
        pa.Table.from_pylist(
            [{"id": 1, "name": "b", ROW_KIND: "+U"}, {"id": 2, "name": "c", ROW_KIND: "+I"}], schema=narrow
        ),
        1,
    )

    assert rows(tmp_path / "table") == [
        {"id": 1, "name": "b", "color": "red"},
        {"id": 2, "name": "c", "color": None},
    ]


# --- a key change whose create arrives while the old key's partition is behind -----------------------
# Log order: id 1 inserted with body b1 (seq 1), body updated to b2 (seq 2), key changed to 2 (seq 5:
# delete of 1, create of 2 without body), then changes of id 2. The create's partition is read first:
# id 1's changes and delete arrive in a later batch, so the create took id 1's image too early.


def old_key_history() -> list[dict[str, Any]]:
    return [
        change("+I", id=1, name="a", body="b1", seq=1),
        change("+U", id=1, name="a", body="b2", seq=2),
        delete_old(seq=5),
    ]


def update_new(seq: int, **row: Any) -> dict[str, Any]:
    if "body" in row:
        return change("+U", id=2, **{"name": "c", **row}, seq=seq)
    return change("+U", id=2, name=row.get("name", "c"), body=None, seq=seq, unavailable=["body"])


def run_batches(tmp_path: Path, mode: str, batches: list[list[dict[str, Any]]]) -> list[Any]:
    """Each batch by a new applier (a restart), then replayed once by another."""
    results = []
    for batch_id, changes in enumerate(batches):
        results.append(applier(tmp_path, **MODES[mode]).apply(table(*changes), batch_id))
        replay = applier(tmp_path, **MODES[mode]).apply(table(*changes), batch_id)
        assert replay.skipped or replay.table_version is None
    return results


def open_slots(tmp_path: Path) -> list[dict[str, Any]]:
    """Carry and claim slots left in the key state."""
    if not DeltaTable.is_deltatable(str(tmp_path / "state")):
        return []
    state = DeltaTable(str(tmp_path / "state")).to_pyarrow_table().to_pylist()
    return [s for s in state if s["_cdcflow_slot"] < -1]


@pytest.mark.parametrize("mode", MODES)
def test_a_create_before_the_old_keys_changes_gets_the_old_keys_last_value(tmp_path: Path, mode: str) -> None:
    run_batches(
        tmp_path,
        mode,
        [
            [create_new(seq=5), update_new(6)],  # id 2's partition first: its create and an update
            old_key_history(),  # id 1's partition, behind: its insert, update and delete
        ],
    )

    assert rows(tmp_path / "table") == [{"id": 2, "name": "c", "body": "b2"}]
    assert open_slots(tmp_path) == []


@pytest.mark.parametrize("mode", MODES)
def test_the_old_keys_last_value_reaches_the_new_key_across_batches_between(
    tmp_path: Path, mode: str
) -> None:
    """Batches of the new key alone between the create and the old key's delete keep it pending; the
    old key's delete shares its batch with another update of the new key."""
    run_batches(
        tmp_path,
        mode,
        [
            [create_new(seq=5)],
            [update_new(6, name="d")],
            [change("+I", id=1, name="a", body="b1", seq=1)],
            [change("+U", id=1, name="a", body="b2", seq=2), delete_old(seq=5), update_new(7, name="e")],
        ],
    )

    assert rows(tmp_path / "table") == [{"id": 2, "name": "e", "body": "b2"}]
    assert open_slots(tmp_path) == []


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("where", ["batch of the create", "batch between", "batch of the old key's delete"])
def test_a_value_the_new_key_sets_itself_wins_over_the_old_keys(
    tmp_path: Path, mode: str, where: str
) -> None:
    own = update_new(6, body="own")
    later = update_new(7)  # and a later update without body: it keeps id 2's own value
    batches = {
        "batch of the create": [[create_new(seq=5), own, later], old_key_history()],
        "batch between": [[create_new(seq=5)], [own], [later, *old_key_history()]],
        "batch of the old key's delete": [[create_new(seq=5)], [*old_key_history(), own, later]],
    }[where]

    run_batches(tmp_path, mode, batches)

    assert rows(tmp_path / "table") == [{"id": 2, "name": "c", "body": "own"}]
    assert open_slots(tmp_path) == []


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("where", ["batch of the create", "batch between", "batch of the old key's delete"])
def test_a_new_key_deleted_before_the_old_keys_delete_arrives_stays_deleted(
    tmp_path: Path, mode: str, where: str
) -> None:
    gone = change("-D", id=2, seq=6)
    batches = {
        "batch of the create": [[create_new(seq=5), gone], old_key_history()],
        "batch between": [[create_new(seq=5)], [gone], old_key_history()],
        "batch of the old key's delete": [[create_new(seq=5)], [*old_key_history(), gone]],
    }[where]

    run_batches(tmp_path, mode, batches)

    assert rows(tmp_path / "table") == []
    assert open_slots(tmp_path) == []


def test_the_old_keys_last_value_lands_once_across_a_crash_between_the_table_and_state_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    applier(tmp_path, sequence_by="seq").apply(table(create_new(seq=5), update_new(6)), 0)
    crash_before_next_state_commit(monkeypatch)
    with pytest.raises(RuntimeError, match="state commit"):
        applier(tmp_path, sequence_by="seq").apply(table(*old_key_history()), 1)
    assert rows(tmp_path / "table") == [{"id": 2, "name": "c", "body": "b2"}]

    replay = applier(tmp_path, sequence_by="seq").apply(table(*old_key_history()), 1)
    assert not replay.skipped and replay.table_version is None  # the table had it: state only
    applier(tmp_path, sequence_by="seq").apply(table(update_new(7, name="f")), 2)

    assert rows(tmp_path / "table") == [{"id": 2, "name": "f", "body": "b2"}]
    assert open_slots(tmp_path) == []
    assert DeltaTable(str(tmp_path / "table")).version() == 3  # batches 0, 1 and 2: one commit each


def moved(old: int, new: int, seq: int) -> list[dict[str, Any]]:
    """The delete of ``old`` and the create of ``new`` (without body) of a key change."""
    return [
        {**change("-D", id=old, seq=seq), NEW_KEY: f'{{"id":{new}}}'},
        {
            **change("+I", id=new, name="a", body=None, seq=seq, unavailable=["body"]),
            OLD_KEY: f'{{"id":{old}}}',
        },
    ]


_D2, _C3 = moved(2, 3, 6)
_D3, _C4 = moved(3, 4, 8)
CHAINS: dict[str, Callable[[], list[list[dict[str, Any]]]]] = {
    "2 -> 3 in one batch": lambda: [[create_new(seq=5), _D2, _C3], old_key_history()],
    "delete of 2 first": lambda: [[create_new(seq=5), _D2], [_C3], old_key_history()],
    "delete of 2 first, 1's delete before 3's create": lambda: [
        [create_new(seq=5), _D2],
        old_key_history(),
        [_C3],
    ],
    "create of 3 first": lambda: [[create_new(seq=5)], [_C3], [_D2], old_key_history()],
    "create of 3 first, 1's delete before 2's": lambda: [
        [create_new(seq=5)],
        [_C3],
        old_key_history(),
        [_D2],
    ],
    "create of 3 first, 1's delete with 2's": lambda: [[create_new(seq=5), _C3], [*old_key_history(), _D2]],
    "all in one batch": lambda: [[create_new(seq=5), _C3, _D2, *old_key_history()]],
    "1 -> 2 -> 3 -> 4": lambda: [[create_new(seq=5), _D2], [_C4, _C3], [_D3], old_key_history()],
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("chain", CHAINS)
def test_a_new_key_moved_on_before_the_old_keys_delete_gets_its_last_value(
    tmp_path: Path, mode: str, chain: str
) -> None:
    """1 -> 2 -> 3 (-> 4): the creates arrive before 1's changes; the last key still gets 1's body."""
    run_batches(tmp_path, mode, CHAINS[chain]())

    last = 4 if "4" in chain else 3
    assert rows(tmp_path / "table") == [{"id": last, "name": "a", "body": "b2"}]
    assert open_slots(tmp_path) == []


def test_a_late_change_in_the_batch_gives_no_value_to_an_unavailable_column(tmp_path: Path) -> None:
    sink = applier(tmp_path, sequence_by="seq")
    sink.apply(table(change("+I", id=1, name="a", body="v1", seq=1)), 0)
    sink.apply(table(change("+U", id=1, name="b", body="v3", seq=3)), 1)

    applied = sink.apply(
        table(
            change("+U", id=1, name="x", body="old", seq=2),  # late: older than the table's seq 3
            change("+U", id=1, name="c", body=None, seq=4, unavailable=["body"]),
        ),
        2,
    )

    assert rows(tmp_path / "table") == [{"id": 1, "name": "c", "body": "v3"}]
    assert applied.late == 1


RESENT: dict[str, Callable[[], list[list[dict[str, Any]]]]] = {
    "the whole key change again": lambda: [moved(1, 2, 5)],
    "only its create": lambda: [[moved(1, 2, 5)[1]]],
    "only its delete": lambda: [[moved(1, 2, 5)[0]]],
    "create first": lambda: [list(reversed(moved(1, 2, 5)))],
    "with the next key change": lambda: [[*moved(1, 2, 5), *moved(2, 3, 8)]],
}


@pytest.mark.parametrize("resent", RESENT)
def test_a_key_change_sent_again_after_the_key_moved_on_changes_nothing(tmp_path: Path, resent: str) -> None:
    """Debezium re-sends from its last flushed offset after a Connect worker restart: 1 -> 2 arrives
    again (new batch ids) after 2 -> 3 landed; 3 keeps 1's body and no key comes back."""
    first = [
        [change("+I", id=1, name="a", body="toast", seq=1)],
        moved(1, 2, 5),
        moved(2, 3, 8),
    ]
    results = run_batches(tmp_path, "sequence_by", first + RESENT[resent]())

    assert rows(tmp_path / "table") == [{"id": 3, "name": "a", "body": "toast"}]
    assert open_slots(tmp_path) == []
    assert sum(r.unavailable_unfilled for r in results) == 0
