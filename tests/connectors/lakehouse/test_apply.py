"""DeltaChangeApplier on hand-written Arrow batches: what each batch leaves in the Delta table, once."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from helpers import FakeClock
from state_crash import crash_before_next_state_commit
from test_spec_002_materialize import ARRIVALS, R20

from cdcflow.connectors.errors import ChangelogConsistencyError, DeltaSchemaError
from cdcflow.connectors.lakehouse.delta.apply import DeltaChangeApplier
from cdcflow.connectors.lakehouse.delta.dead_letters import DeadLetterFiles
from cdcflow.connectors.lakehouse.delta.options import ApplyOptions, Materialize, Unsequenced
from cdcflow.core import Change

ROW_KIND = "_row_kind"
NAMES = pa.schema([("id", pa.int64()), ("name", pa.string()), (ROW_KIND, pa.string())])
SEQUENCED = pa.schema(
    [("id", pa.int64()), ("name", pa.string()), ("seq", pa.int64()), (ROW_KIND, pa.string())]
)
JOINED = pa.schema(
    [("id", pa.int64()), ("level", pa.int64()), ("attr", pa.string()), (ROW_KIND, pa.string())]
)
KEY = ("id",)


def batch(schema: pa.Schema, *changes: tuple[str, dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist([{**row, ROW_KIND: kind} for kind, row in changes], schema=schema)


def i(**row: Any) -> tuple[str, dict[str, Any]]:
    return "+I", row


def ub(**row: Any) -> tuple[str, dict[str, Any]]:
    return "-U", row


def ua(**row: Any) -> tuple[str, dict[str, Any]]:
    return "+U", row


def d(**row: Any) -> tuple[str, dict[str, Any]]:
    return "-D", row


def rows(path: Path, key: Sequence[str] = KEY) -> list[dict[str, Any]]:
    if not DeltaTable.is_deltatable(str(path)):
        return []
    found: list[dict[str, Any]] = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    return sorted(found, key=lambda row: tuple(row[c] for c in key))


def txn_versions(path: Path, app_id: str) -> list[int]:
    """The batch ids the Delta log records as application transactions of ``app_id``, commit by commit."""
    out = []
    for commit in sorted((path / "_delta_log").glob("*.json")):
        for line in commit.read_text(encoding="utf-8").splitlines():
            action = json.loads(line)
            if "txn" in action and action["txn"]["appId"] == app_id:
                out.append(action["txn"]["version"])
    return out


def applier(tmp_path: Path, clock: Callable[[], float] | None = None, **options: Any) -> DeltaChangeApplier:
    opts = ApplyOptions(key=options.pop("key", KEY), **{"upsert_key": KEY, **options})
    state = str(tmp_path / "state") if opts.stateful else None
    extra = {"clock": clock} if clock is not None else {}
    return DeltaChangeApplier(str(tmp_path / "table"), opts, app_id="app", state_path=state, **extra)


# --- upserts and deletes ----------------------------------------------------------------------------


def test_inserts_updates_and_deletes_land_by_key(tmp_path: Path) -> None:
    sink = applier(tmp_path)

    first = sink.apply(batch(NAMES, i(id=1, name="a"), i(id=2, name="b"), i(id=3, name="c")), 0)
    second = sink.apply(
        batch(NAMES, ub(id=1, name="a"), ua(id=1, name="a2"), d(id=2, name="b"), i(id=4, name="d")), 1
    )

    assert rows(tmp_path / "table") == [
        {"id": 1, "name": "a2"},
        {"id": 3, "name": "c"},
        {"id": 4, "name": "d"},
    ]
    assert (first.changes, first.upserts, first.deletes, first.skipped) == (3, 3, 0, False)
    assert (second.changes, second.upserts, second.deletes) == (4, 2, 1)
    assert second.table_version == DeltaTable(str(tmp_path / "table")).version()


def test_a_delete_needs_only_the_key(tmp_path: Path) -> None:
    sink = applier(tmp_path)
    sink.apply(batch(NAMES, i(id=1, name="a"), i(id=2, name="b")), 0)

    sink.apply(batch(NAMES, d(id=1, name=None), d(id=9, name=None)), 1)

    assert rows(tmp_path / "table") == [{"id": 2, "name": "b"}]


def test_of_several_changes_to_a_key_in_one_batch_the_last_wins(tmp_path: Path) -> None:
    sink = applier(tmp_path)
    sink.apply(batch(NAMES, i(id=5, name="old")), 0)

    applied = sink.apply(
        batch(
            NAMES,
            i(id=1, name="a"),
            ub(id=1, name="a"),
            ua(id=1, name="b"),
            i(id=2, name="x"),
            ub(id=1, name="b"),
            ua(id=1, name="c"),
            d(id=2, name="x"),
            d(id=3, name=None),
            i(id=3, name="y"),
            d(id=5, name=None),
        ),
        1,
    )

    assert rows(tmp_path / "table") == [{"id": 1, "name": "c"}, {"id": 3, "name": "y"}]
    assert (applied.upserts, applied.deletes) == (2, 2)


def test_composite_keys(tmp_path: Path) -> None:
    schema = pa.schema(
        [("region", pa.string()), ("id", pa.int64()), ("name", pa.string()), (ROW_KIND, pa.string())]
    )
    key = ("region", "id")
    sink = applier(tmp_path, key=key, upsert_key=key)
    sink.apply(batch(schema, i(region="eu", id=1, name="a"), i(region="us", id=1, name="b")), 0)

    sink.apply(
        batch(
            schema,
            d(region="eu", id=1, name=None),
            ub(region="us", id=1, name="b"),
            ua(region="us", id=1, name="b2"),
            i(region="eu", id=2, name="c"),
        ),
        1,
    )

    assert rows(tmp_path / "table", key) == [
        {"region": "eu", "id": 2, "name": "c"},
        {"region": "us", "id": 1, "name": "b2"},
    ]


def test_composite_keys_with_materialization(tmp_path: Path) -> None:
    schema = pa.schema(
        [("region", pa.string()), ("id", pa.int64()), ("name", pa.string()), (ROW_KIND, pa.string())]
    )
    key = ("region", "id")
    sink = applier(tmp_path, key=key, upsert_key=None, materialize=Materialize.FORCE)
    sink.apply(batch(schema, i(region="eu", id=1, name="a"), i(region="us", id=1, name="b")), 0)

    # the update's +U overtakes its -U across batches (a shuffle): the live row stays
    sink.apply(batch(schema, ua(region="us", id=1, name="b2"), d(region="eu", id=1, name="a")), 1)
    sink.apply(batch(schema, ub(region="us", id=1, name="b")), 2)

    assert rows(tmp_path / "table", key) == [{"region": "us", "id": 1, "name": "b2"}]


def test_a_retraction_that_matches_no_live_row_still_removes_its_key(tmp_path: Path) -> None:
    clock = FakeClock()
    sink = applier(tmp_path, clock, upsert_key=None, state_ttl=timedelta(hours=1))
    sink.apply(batch(NAMES, i(id=1, name="a"), i(id=2, name="b")), 0)

    key_only = sink.apply(batch(NAMES, d(id=1, name=None)), 1)  # a delete's image with the key only
    clock.now += 2 * 60 * 60
    expired = sink.apply(batch(NAMES, d(id=2, name="b")), 2)  # the key's live rows expired from state

    assert rows(tmp_path / "table") == []
    assert (key_only.unmatched_retractions, key_only.deletes) == (1, 1)
    assert (expired.unmatched_retractions, expired.deletes) == (1, 1)


# --- sequence_by: last writer wins, late changes ignored --------------------------------------------


def test_sequence_by_keeps_the_highest_sequence_and_counts_late_changes(tmp_path: Path) -> None:
    sink = applier(tmp_path, sequence_by="seq")
    sink.apply(batch(SEQUENCED, i(id=1, name="a", seq=5), i(id=2, name="b", seq=1)), 0)

    mixed = sink.apply(
        batch(
            SEQUENCED,
            ua(id=1, name="newest", seq=9),
            ua(id=1, name="newer", seq=7),  # arrives after seq 9: loses to it within the batch
            ua(id=2, name="stale", seq=0),  # older than the table's seq 1: late
        ),
        1,
    )
    late = sink.apply(batch(SEQUENCED, ua(id=1, name="late", seq=8)), 2)

    assert rows(tmp_path / "table") == [
        {"id": 1, "name": "newest", "seq": 9},
        {"id": 2, "name": "b", "seq": 1},
    ]
    assert mixed.late == 1
    assert late.late == 1 and late.upserts == 0


def test_a_late_insert_after_a_delete_resurrects_nothing_until_the_tombstone_expires(tmp_path: Path) -> None:
    clock = FakeClock()
    sink = applier(tmp_path, clock, sequence_by="seq", delete_retention=timedelta(hours=1))
    sink.apply(batch(SEQUENCED, i(id=1, name="a", seq=1)), 0)
    sink.apply(batch(SEQUENCED, d(id=1, name=None, seq=5)), 1)

    clock.now += 30 * 60
    within = sink.apply(batch(SEQUENCED, i(id=1, name="zombie", seq=3)), 2)
    assert rows(tmp_path / "table") == []
    assert within.late == 1

    clock.now += 60 * 60
    after = sink.apply(batch(SEQUENCED, i(id=1, name="again", seq=3)), 3)
    assert rows(tmp_path / "table") == [{"id": 1, "name": "again", "seq": 3}]
    assert after.late == 0


UNSEQUENCED = (i(id=1, name="a", seq=10), ua(id=1, name="b", seq=None), i(id=2, name="c", seq=12))


def test_a_change_without_a_sequence_is_a_dead_letter_with_the_reason(tmp_path: Path) -> None:
    dead = DeadLetterFiles(str(tmp_path / "dead-letters"))
    options = ApplyOptions(key=KEY, upsert_key=KEY, sequence_by="seq")
    sink = DeltaChangeApplier(
        str(tmp_path / "table"), options, app_id="app", state_path=str(tmp_path / "state"), dead_letters=dead
    )

    applied = sink.apply(batch(SEQUENCED, *UNSEQUENCED), 0)
    replayed = sink.apply(batch(SEQUENCED, *UNSEQUENCED), 0)

    assert rows(tmp_path / "table") == [{"id": 1, "name": "a", "seq": 10}, {"id": 2, "name": "c", "seq": 12}]
    assert (applied.unsequenced, applied.upserts) == (1, 2)
    assert replayed.skipped
    [letter] = dead.read()
    assert {k: v for k, v in letter.items() if k != "reason"} == {
        "field": "seq",
        "origin": "row 1 of batch 0",
        "batch": 0,
        "row_kind": "+U",
        "row": {"id": 1, "name": "b", "seq": None},
    }
    assert "seq is NULL" in letter["reason"] and "unsequenced='arrival'" in letter["reason"]


def test_with_unsequenced_arrival_a_change_without_a_sequence_applies_where_it_arrived(
    tmp_path: Path,
) -> None:
    sink = applier(tmp_path, sequence_by="seq", unsequenced=Unsequenced.ARRIVAL)

    applied = sink.apply(batch(SEQUENCED, *UNSEQUENCED), 0)
    assert rows(tmp_path / "table") == [
        {"id": 1, "name": "b", "seq": None},
        {"id": 2, "name": "c", "seq": 12},
    ]
    assert applied.unsequenced == 1

    # Never late, even after a late change of its key; the key keeps its sequence (10).
    later = sink.apply(batch(SEQUENCED, ua(id=1, name="x", seq=9), ua(id=1, name="d", seq=None)), 1)
    late = sink.apply(batch(SEQUENCED, ua(id=1, name="y", seq=9)), 2)

    assert rows(tmp_path / "table")[0] == {"id": 1, "name": "d", "seq": None}
    assert (later.unsequenced, later.late, late.late) == (1, 1, 1)


# --- exactly once -----------------------------------------------------------------------------------


def test_a_batch_id_is_applied_once(tmp_path: Path) -> None:
    sink = applier(tmp_path)
    table = tmp_path / "table"
    sink.apply(batch(NAMES, i(id=1, name="a")), 0)
    version = DeltaTable(str(table)).version()

    again = sink.apply(batch(NAMES, i(id=1, name="changed"), i(id=2, name="b")), 0)
    assert again.skipped
    assert DeltaTable(str(table)).version() == version
    sink.apply(batch(NAMES, i(id=3, name="c")), 1)
    older = sink.apply(batch(NAMES, d(id=1, name=None)), 0)

    assert older.skipped
    assert rows(table) == [{"id": 1, "name": "a"}, {"id": 3, "name": "c"}]
    assert txn_versions(table, "app") == [0, 1]
    assert sink.done(1) and not sink.done(2)
    assert sink.applied_batch() == 1


@pytest.mark.parametrize("mode", ["sequence_by", "materialize"])
def test_a_crash_between_the_table_and_the_key_state_commits_is_caught_up_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    options: dict[str, Any] = (
        {"sequence_by": "seq"} if mode == "sequence_by" else {"materialize": Materialize.FORCE}
    )
    sink = applier(tmp_path, **options)
    table, state = tmp_path / "table", tmp_path / "state"
    sink.apply(batch(SEQUENCED, i(id=1, name="a", seq=1)), 0)
    crash_before_next_state_commit(monkeypatch)
    update = batch(SEQUENCED, ub(id=1, name="a", seq=1), ua(id=1, name="b", seq=4), i(id=2, name="c", seq=2))
    with pytest.raises(RuntimeError, match="state commit"):
        sink.apply(update, 1)
    assert DeltaTable(str(table)).transaction_version("app") == 1
    assert DeltaTable(str(state)).transaction_version("app") == 0
    assert not sink.done(1)
    version = DeltaTable(str(table)).version()

    replay = sink.apply(update, 1)

    assert not replay.skipped and replay.table_version is None
    assert DeltaTable(str(table)).version() == version, "the table is not merged twice"
    assert DeltaTable(str(state)).transaction_version("app") == 1
    assert txn_versions(table, "app") == [0, 1]
    assert txn_versions(state, "app") == [0, 1]
    assert sink.done(1) and sink.apply(update, 1).skipped
    assert rows(table) == [{"id": 1, "name": "b", "seq": 4}, {"id": 2, "name": "c", "seq": 2}]

    # the state knows batch 1: under sequence_by a change older than seq 4 is late; under
    # materialization the -U of b (added in batch 1) retracts the live row
    follow = (
        batch(SEQUENCED, ua(id=1, name="late", seq=3))
        if mode == "sequence_by"
        else batch(SEQUENCED, ub(id=1, name="b", seq=4), ua(id=1, name="e", seq=5))
    )
    after = sink.apply(follow, 2)
    assert after.unmatched_retractions == 0
    if mode == "sequence_by":
        assert after.late == 1
        assert rows(table)[0] == {"id": 1, "name": "b", "seq": 4}
    else:
        assert rows(table)[0] == {"id": 1, "name": "e", "seq": 5}


def test_a_replayed_batch_that_changed_only_the_key_state_is_not_applied_again(tmp_path: Path) -> None:
    """Materialization can consume a batch without touching the table (a retraction of a live row that
    is not the one shown). Replayed, as Spark does when it dies before its own commit, the batch must
    not be applied to the key state a second time."""
    sink = applier(tmp_path, upsert_key=None, materialize=Materialize.FORCE)
    a, b = {"id": 1, "level": 10, "attr": "a"}, {"id": 1, "level": 20, "attr": "b"}
    sink.apply(batch(JOINED, i(**a), i(**b), i(**a)), 0)  # live rows of id 1: a, b, a; the table shows a
    sink.apply(batch(JOINED, ub(**a)), 1)  # live: b, a; the table still shows a
    assert rows(tmp_path / "table") == [a]

    replay = sink.apply(batch(JOINED, ub(**a)), 1)

    assert rows(tmp_path / "table") == [a], "the replay retracted a second copy of a"
    assert replay.skipped


NESTED = {
    "bigint (control)": (pa.int64(), 1, 2),
    "list": (pa.list_(pa.int32()), [1, 2], [3]),
    "struct": (pa.struct([("x", pa.int32())]), {"x": 1}, {"x": 2}),
    "map": (pa.map_(pa.string(), pa.int32()), [("k", 1)], [("k", 2)]),
}


@pytest.mark.parametrize("nested", NESTED)
@pytest.mark.parametrize(
    ("key", "options"),
    [
        (("id",), {"sequence_by": "seq"}),
        (("id", "region"), {"sequence_by": "seq"}),
        (("id", "region"), {"materialize": Materialize.FORCE}),
    ],
    ids=["sequence_by", "sequence_by, composite key", "materialize, composite key"],
)
def test_a_nested_column_is_updated_by_a_later_batch(
    tmp_path: Path, nested: str, key: tuple[str, ...], options: dict[str, Any]
) -> None:
    kind, old, new = NESTED[nested]
    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("region", pa.string()),
            ("seq", pa.int64()),
            ("c", kind),
            (ROW_KIND, pa.string()),
        ]
    )
    sink = applier(tmp_path, key=key, upsert_key=key, **options)
    sink.apply(batch(schema, i(id=1, region="eu", seq=1, c=old)), 0)

    sink.apply(batch(schema, ub(id=1, region="eu", seq=1, c=old), ua(id=1, region="eu", seq=2, c=new)), 1)

    assert rows(tmp_path / "table") == [{"id": 1, "region": "eu", "seq": 2, "c": new}]


# --- schema evolution -------------------------------------------------------------------------------


def test_a_new_nullable_column_is_added_to_the_table(tmp_path: Path) -> None:
    sink = applier(tmp_path)
    sink.apply(batch(NAMES, i(id=1, name="a")), 0)
    wider = NAMES.insert(2, pa.field("color", pa.string()))

    sink.apply(batch(wider, i(id=2, name="b", color="red")), 1)

    assert rows(tmp_path / "table") == [
        {"id": 1, "name": "a", "color": None},
        {"id": 2, "name": "b", "color": "red"},
    ]


def test_a_new_not_null_column_is_refused_naming_it(tmp_path: Path) -> None:
    sink = applier(tmp_path)
    sink.apply(batch(NAMES, i(id=1, name="a")), 0)
    wider = NAMES.insert(2, pa.field("weight", pa.float64(), nullable=False))

    with pytest.raises(DeltaSchemaError, match="'weight'.*NOT NULL"):
        sink.apply(batch(wider, i(id=2, name="b", weight=1.5)), 1)
    assert DeltaTable(str(tmp_path / "table")).schema().to_arrow().names == ["id", "name"]


def test_a_type_change_is_refused_naming_the_column(tmp_path: Path) -> None:
    sink = applier(tmp_path)
    sink.apply(batch(NAMES, i(id=1, name="a")), 0)
    retyped = pa.schema([("id", pa.int64()), ("name", pa.int64()), (ROW_KIND, pa.string())])

    with pytest.raises(DeltaSchemaError, match="column 'name' is int64 in the changelog but string"):
        sink.apply(batch(retyped, i(id=2, name=7)), 1)
    assert rows(tmp_path / "table") == [{"id": 1, "name": "a"}]


def test_time_columns_are_stored_as_iso_text(tmp_path: Path) -> None:
    schema = pa.schema(
        [("id", pa.int64()), ("at_us", pa.time64("us")), ("at_ms", pa.time32("ms")), (ROW_KIND, pa.string())]
    )
    times = [dt.time(12, 30, 0, 1), dt.time(0, 0), dt.time(23, 59, 59, 999000)]
    sink = applier(tmp_path)

    sink.apply(
        batch(
            schema,
            *(
                i(id=n, at_us=t, at_ms=t.replace(microsecond=t.microsecond // 1000 * 1000))
                for n, t in enumerate(times)
            ),
        ),
        0,
    )

    stored = DeltaTable(str(tmp_path / "table")).to_pyarrow_table()
    assert stored.schema.field("at_us").type == pa.string()
    assert stored.schema.field("at_ms").type == pa.string()
    got = sorted(stored.to_pylist(), key=lambda row: row["id"])
    assert [row["at_us"] for row in got] == ["12:30:00.000001", "00:00:00.000000", "23:59:59.999000"]
    assert [dt.time.fromisoformat(row["at_ms"]) for row in got] == [dt.time(12, 30), dt.time(0, 0), times[2]]


# --- a changelog the sink cannot apply --------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "where"),
    [
        ({"file": pa.string(), "line": pa.int64()}, "events.json:7"),
        ({"topic": pa.string(), "partition": pa.int32(), "offset": pa.int64()}, "orders/2@41"),
        ({}, "row 1 of batch 5"),
    ],
    ids=["file:line", "topic/partition@offset", "no coordinates"],
)
def test_a_null_key_is_refused_naming_where_it_came_from(
    tmp_path: Path, extra: dict[str, pa.DataType], where: str
) -> None:
    schema = pa.schema([*((n, t) for n, t in extra.items()), *NAMES])
    origin = {"file": "events.json", "line": 7, "topic": "orders", "partition": 2, "offset": 41}
    coordinates = {n: origin[n] for n in extra}
    first = {n: (v - 1 if isinstance(v, int) else v) for n, v in coordinates.items()}
    sink = applier(tmp_path)

    with pytest.raises(ChangelogConsistencyError) as error:
        sink.apply(batch(schema, i(id=1, name="a", **first), i(id=None, name="b", **coordinates)), 5)

    assert str(error.value).startswith(f"{where}: key column 'id' is null")
    assert not DeltaTable.is_deltatable(str(tmp_path / "table"))


@pytest.mark.parametrize(
    "changes",
    [
        [i(id=1, name="a"), ub(id=1, name="a")],
        [ub(id=1, name="a"), ua(id=2, name="b")],
        [ub(id=1, name="a"), i(id=1, name="b")],
    ],
    ids=["-U last in the batch", "+U of another key", "+I after the -U"],
)
def test_an_unpaired_update_before_is_refused_without_materialization(
    tmp_path: Path, changes: list[tuple[str, dict[str, Any]]]
) -> None:
    sink = applier(tmp_path, materialize=Materialize.NONE)

    with pytest.raises(
        ChangelogConsistencyError,
        match=r"^row \d of batch 3: a -U is not followed by the \+U.*materialize='force'",
    ):
        sink.apply(batch(NAMES, *changes), 3)
    assert not DeltaTable.is_deltatable(str(tmp_path / "table"))


# --- spec 002: the join's three arrival orders, materialized ---------------------------------------


def as_batch(changes: Sequence[Change]) -> pa.Table:
    return batch(JOINED, *((c.kind.value, c.row) for c in changes))


@pytest.mark.parametrize("upsert_key", [None, ("id", "level")], ids=["no upsert key", "upsert key id, level"])
@pytest.mark.parametrize("one_batch", [False, True], ids=["a batch per change", "one batch"])
@pytest.mark.parametrize("order", ARRIVALS)
def test_spec_002_every_arrival_order_leaves_level_20(
    tmp_path: Path, order: str, one_batch: bool, upsert_key: tuple[str, ...] | None
) -> None:
    sink = applier(tmp_path, upsert_key=upsert_key, materialize=Materialize.FORCE)
    changes = ARRIVALS[order]
    parts = [changes] if one_batch else [[change] for change in changes]

    results = [sink.apply(as_batch(part), batch_id) for batch_id, part in enumerate(parts)]

    assert rows(tmp_path / "table") == [R20]
    assert sum(r.unmatched_retractions for r in results) == 0


@pytest.mark.parametrize("order", [o for o in ARRIVALS if "in order" not in o])
def test_spec_002_out_of_order_arrivals_are_refused_without_materialization(
    tmp_path: Path, order: str
) -> None:
    sink = applier(tmp_path, materialize=Materialize.NONE)

    with pytest.raises(ChangelogConsistencyError, match="materialize='force'"):
        sink.apply(as_batch(ARRIVALS[order]), 0)


def test_a_dictionary_encoded_key_with_unused_entries_lands_one_row_per_key(tmp_path: Path) -> None:
    """A key column dictionary-encoded (pandas' categoricals, a filtered Arrow table) whose dictionary
    holds values no row uses: each key still has one winner."""
    ids = pa.array(["a", "b", "c"]).dictionary_encode().take(pa.array([1, 1, 2]))
    changes = pa.table({"id": ids, "name": ["x", "y", "z"], ROW_KIND: ["+I", "+U", "+I"]})
    applier(tmp_path).apply(changes, 0)

    assert rows(tmp_path / "table") == [{"id": "b", "name": "y"}, {"id": "c", "name": "z"}]
