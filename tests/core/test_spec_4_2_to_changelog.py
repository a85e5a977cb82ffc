"""Spec 4.2 TO_CHANGELOG: every example as a test (../shared/spec/000_*.txt).

Expected outputs are copied from the spec; where it contradicts itself or leaves a choice open we
follow docs/spec-notes.md and cite the note ("note N"). Rows are compared with their column order.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from helpers import (
    At,
    FakeClock,
    Row,
    assert_exact,
    dele,
    ins,
    run_steps,
    stored_images,
    t,
    ua,
    ub,
    wall,
    wm,
)

from cdcflow import to_changelog
from cdcflow.core import (
    InMemoryStateStore,
)


def test_4_2_1_1_default_signature() -> None:
    changes = [ins(id=5, name="name"), ua(id=5, name="updated_name"), dele(id=5, name="updated_name")]
    # note 8: op comes first
    assert_exact(
        list(to_changelog(changes)),
        [
            {"op": "INSERT", "id": 5, "name": "name"},
            {"op": "UPDATE_AFTER", "id": 5, "name": "updated_name"},
            {"op": "DELETE", "id": 5, "name": "updated_name"},
        ],
    )


def test_4_2_1_2_1_flat_records_output() -> None:
    changes = [
        ins(id=5, name="name"),
        ub(id=5, name="name"),
        ua(id=5, name="updated_name"),
        dele(id=5, name="updated_name"),
    ]
    # The spec partitions by `key`, a column the rows do not have, and writes the full delete row: as in
    # note 12 we run it without partition_by, so the delete keeps the whole row (note 5).
    emitted, _ = run_steps(to_changelog, changes)
    assert_exact(
        emitted,
        [
            [{"op": "INSERT", "id": 5, "name": "name"}],
            [],  # -U ignored by default (note 4)
            [{"op": "UPDATE_AFTER", "id": 5, "name": "updated_name"}],
            [{"op": "DELETE", "id": 5, "name": "updated_name"}],
            [],
        ],
    )


@pytest.mark.parametrize(
    "op_mapping",
    [
        {"INSERT": "c", "DELETE": "d", "UPDATE_BEFORE, UPDATE_AFTER": "u"},
        {("INSERT",): ["c"], ("DELETE",): ["d"], ("UPDATE_BEFORE", "UPDATE_AFTER"): ["u"]},
        [(["INSERT"], ["c"]), (["DELETE"], ["d"]), (["UPDATE_BEFORE", "UPDATE_AFTER"], ["u"])],
    ],
    ids=["map", "array", "array-pairs"],
)
def test_4_2_1_2_2_explicit_update_mapping_with_before_after(op_mapping: Any) -> None:
    emitted, _ = run_steps(
        to_changelog,
        [ub(id=5, name="old"), ua(id=5, name="new")],
        before="before_state",
        after="after_state",
        op_mapping=op_mapping,
    )
    assert_exact(
        emitted,
        [
            [],  # the -U is buffered until its +U (note 6)
            [{"op": "u", "before_state": {"id": 5, "name": "old"}, "after_state": {"id": 5, "name": "new"}}],
            [],
        ],
    )


def test_4_2_1_3_1_state_ttl_with_unified_updates() -> None:
    # The spec's output has before/after fields its SQL does not declare; we declare them.
    emitted, _ = run_steps(
        to_changelog,
        [At("14:00", ub(id=1, val=10)), At("14:02", ua(id=1, val=20))],
        before="before",
        after="after",
        state_ttl=timedelta(minutes=5),
        op_mapping={"INSERT": "INSERT", "DELETE": "DELETE", "UPDATE_BEFORE, UPDATE_AFTER": "UPDATE"},
        clock=FakeClock(),
    )
    assert_exact(
        emitted,
        [
            [],  # stored -U payload, expires in 5 minutes
            [{"op": "UPDATE", "before": {"id": 1, "val": 10}, "after": {"id": 1, "val": 20}}],
            [],
        ],
    )


def test_4_2_1_3_2_watermark_compaction() -> None:
    emitted, _ = run_steps(
        to_changelog,
        [
            wm("10:00"),
            ins(id=5, name="Alice", event_time=t("10:05")),  # A
            ub(id=5, name="Alice", event_time=t("10:06")),  # B
            ua(id=5, name="Alice Updated", event_time=t("10:06")),
            ins(id=6, name="Bob", event_time=t("10:30")),  # C
            wm("10:25"),
            ub(id=5, name="Alice Updated", event_time=t("10:50")),  # D
            ua(id=5, name="Alice Final", event_time=t("10:50")),
            wm("10:45"),
            ins(id=7, name="Carol", event_time=t("11:10")),  # E
            wm("11:05"),
        ],
        partition_by="id",
        on_time="event_time",
        state_ttl=timedelta(days=7),
        before="before_state",
        after="after_state",
        op_mapping={"INSERT": "c", "DELETE": "d", "UPDATE_BEFORE, UPDATE_AFTER": "u"},
        clock=FakeClock(),
    )

    def c(**row: Any) -> Row:
        return {"op": "c", "before_state": None, "after_state": row}

    def u(before: Row, after: Row) -> Row:
        return {"op": "u", "before_state": before, "after_state": after}

    # As the spec shows, the on_time column (event_time) is not part of the images.
    assert_exact(
        emitted,
        [
            [], [], [], [], [],
            # watermark 10:25: +I then -U/+U for id=5 compacted into one insert of the final state (note 9)
            [c(id=5, name="Alice Updated")],
            [], [],
            # watermark 10:45 passes Bob's 10:30: the spec does not list this emission; buffering implies it
            [c(id=6, name="Bob")],
            [],
            # watermark 11:05: the update for id=5, before image from the stored state
            [u({"id": 5, "name": "Alice Updated"}, {"id": 5, "name": "Alice Final"})],
            [c(id=7, name="Carol")],  # end of input
        ],
    )  # fmt: skip


DYNAMIC_TABLE_MAPPING = {"INSERT": "c", "DELETE": "d", "UPDATE_AFTER": "u"}


def test_4_2_1_4_1_producing_partial_deletes() -> None:
    out = list(
        to_changelog([dele(id=5, name="Alice", age=30)], partition_by="id", op_mapping=DYNAMIC_TABLE_MAPPING)
    )
    assert_exact(out, [{"op": "d", "id": 5}])


def test_4_2_1_4_2_producing_full_deletes() -> None:
    kwargs: dict[str, Any] = {
        "partition_by": "id",
        "produces_full_deletes": True,
        "op_mapping": DYNAMIC_TABLE_MAPPING,
    }
    out = list(to_changelog([dele(id=5, name="Alice", age=30)], **kwargs))
    assert_exact(out, [{"op": "d", "id": 5, "name": "Alice", "age": 30}])

    # Upsert input with a partial delete: the stored image stands in for ChangelogNormalize (note 5).
    out = list(
        to_changelog(
            [ins(id=5, name="Alice", age=30), dele(id=5)],
            state_ttl=timedelta(hours=1),
            clock=FakeClock(),
            **kwargs,
        )
    )
    assert_exact(
        out,
        [{"op": "c", "id": 5, "name": "Alice", "age": 30}, {"op": "d", "id": 5, "name": "Alice", "age": 30}],
    )


ENVELOPE_MAPPING = {"INSERT": "c", "DELETE": "d", "UPDATE_BEFORE, UPDATE_AFTER": "u"}


def test_4_2_1_5_1_producing_cdc_envelope_with_metadata() -> None:
    _assert_envelope_with_metadata()


def _assert_envelope_with_metadata() -> None:
    """4.2.1.5.1 and 4.2.2.9 show the same example."""
    out = list(
        to_changelog(
            [ins(id=1, name="Alice", ts_ms=1234)],
            partition_by="id",
            before="before",
            after="after",
            passthrough="ts_ms",
            op_mapping=ENVELOPE_MAPPING,
        )
    )
    # Output schema: [op, ...passthrough fields..., before, after]
    assert_exact(out, [{"op": "c", "ts_ms": 1234, "before": None, "after": {"id": 1, "name": "Alice"}}])


def test_4_2_1_6_complete_signature() -> None:
    # note 12: without partition_by (the rows have no `k`); likewise without passthrough, since the rows
    # have neither field1 nor field2 and the spec's output shows none (note 3: a missing field fails).
    emitted, _ = run_steps(
        to_changelog,
        [
            ins(id=5, name="name"),
            ub(id=5, name="name"),
            ua(id=5, name="updated_name"),
            dele(id=5, name="updated_name"),
        ],
        uid="my-cdc-ptf",
        before="before",
        after="after",
        op="op",
        state_ttl=timedelta(minutes=10),
        produces_full_deletes=False,
        op_mapping=ENVELOPE_MAPPING,
        clock=FakeClock(),
    )
    assert_exact(
        emitted,
        [
            [{"op": "c", "before": None, "after": {"id": 5, "name": "name"}}],
            [],
            [{"op": "u", "before": {"id": 5, "name": "name"}, "after": {"id": 5, "name": "updated_name"}}],
            [{"op": "d", "before": {"id": 5, "name": "updated_name"}, "after": None}],
            [],
        ],
    )


def test_4_2_2_1_retract_upsert_stream_to_upsert_stream_with_deletion_flag() -> None:
    kwargs: dict[str, Any] = {
        "partition_by": "id",
        "op": "deleted",
        "op_mapping": {"INSERT, UPDATE_AFTER": "false", "DELETE": "true"},
    }
    # The spec writes the full row and puts `deleted` last. note 5: the default writes a partial delete;
    # note 8: op comes first. Both outputs:
    assert_exact(list(to_changelog([dele(id=5, name="A")], **kwargs)), [{"deleted": "true", "id": 5}])
    assert_exact(
        list(to_changelog([dele(id=5, name="A")], produces_full_deletes=True, **kwargs)),
        [{"deleted": "true", "id": 5, "name": "A"}],
    )
    # UPDATE_BEFORE is dropped if it exists
    out = list(to_changelog([ins(id=5, name="A"), ub(id=5, name="A"), ua(id=5, name="B")], **kwargs))
    assert_exact(
        out, [{"deleted": "false", "id": 5, "name": "A"}, {"deleted": "false", "id": 5, "name": "B"}]
    )


def test_4_2_2_2_retract_upsert_stream_to_upsert_stream() -> None:
    out = list(
        to_changelog(
            [ua(id=7, val=50)],
            partition_by="id",
            op="op_code",
            op_mapping={"INSERT": "I", "DELETE": "D", "UPDATE_AFTER": "U"},
        )
    )
    assert_exact(out, [{"op_code": "U", "id": 7, "val": 50}])


def test_4_2_2_3_retract_stream_to_upsert_stream() -> None:
    retract = [ub(id=1, val=10), ua(id=1, val=20)]
    kwargs: dict[str, Any] = {
        "partition_by": "id",
        "uid": "nested-cdc-out",
        "op_mapping": DYNAMIC_TABLE_MAPPING,
    }
    store = InMemoryStateStore()
    # flat; the -U is simply dropped (note 4: an explicit mapping drops the kinds it does not name)
    assert_exact(list(to_changelog(retract, state_store=store, **kwargs)), [{"op": "u", "id": 1, "val": 20}])
    # or nested in one payload field
    out = list(to_changelog(retract, before="payload", after="payload", state_store=store, **kwargs))
    assert_exact(out, [{"op": "u", "payload": {"id": 1, "val": 20}}])
    assert len(store) == 0  # no state


def test_4_2_2_4_upsert_stream_to_upsert_stream() -> None:
    store = InMemoryStateStore()
    out = list(
        to_changelog(
            [ins(id=1, val=10), ua(id=1, val=20)],
            partition_by="id",
            uid="nested-cdc-out",
            before="payload",
            after="payload",
            op_mapping=DYNAMIC_TABLE_MAPPING,
            state_store=store,
        )
    )
    assert_exact(
        out, [{"op": "c", "payload": {"id": 1, "val": 10}}, {"op": "u", "payload": {"id": 1, "val": 20}}]
    )
    assert len(store) == 0


def test_4_2_2_5_producing_partial_deletes_for_upsert_sink() -> None:
    out = list(
        to_changelog([dele(id=5, name="Alice", age=30)], partition_by="id", op_mapping=DYNAMIC_TABLE_MAPPING)
    )
    assert_exact(out, [{"op": "d", "id": 5}])


def test_4_2_2_6_producing_full_deletes_for_cdc_sink() -> None:
    out = list(
        to_changelog(
            [dele(id=5, name="Alice", age=30)],
            partition_by="id",
            produces_full_deletes=True,
            op_mapping=DYNAMIC_TABLE_MAPPING,
        )
    )
    assert_exact(out, [{"op": "d", "id": 5, "name": "Alice", "age": 30}])


def test_4_2_2_7_retract_stream_to_retract_stream_with_before_after() -> None:
    emitted, _ = run_steps(
        to_changelog,
        [ub(id=1, val=10), ua(id=1, val=20)],
        partition_by="id",
        uid="nested-cdc-out",
        before="before",
        after="after",
        state_ttl=timedelta(hours=1),
        op_mapping=ENVELOPE_MAPPING,
        clock=FakeClock(),
    )
    assert_exact(
        emitted,
        [[], [{"op": "u", "before": {"id": 1, "val": 10}, "after": {"id": 1, "val": 20}}], []],
    )


def test_4_2_2_8_upsert_stream_to_retract_stream_with_before_after() -> None:
    store = InMemoryStateStore()
    emitted, states = run_steps(
        to_changelog,
        [ins(id=1, val=10), ua(id=1, val=20)],
        probe=lambda: stored_images(store),
        partition_by="id",
        uid="nested-cdc-out",
        before="before",
        after="after",
        state_ttl=timedelta(hours=1),
        op_mapping=DYNAMIC_TABLE_MAPPING,
        clock=FakeClock(),
        state_store=store,
    )
    # The spec lists only the update; the insert before it is written too.
    insert = {"op": "c", "before": None, "after": {"id": 1, "val": 10}}
    update = {
        "op": "u",
        "before": {"id": 1, "val": 10},
        "after": {"id": 1, "val": 20},
    }  # before from state (note 7)
    assert_exact(emitted, [[insert], [update], []])
    # State required: the previous image is stored for the key (FakeClock starts at 12:00, TTL one hour).
    assert states[0] == [({"id": 1, "val": 10}, wall("13:00"))]


def test_4_2_2_9_producing_cdc_envelope_with_metadata_passthrough() -> None:
    _assert_envelope_with_metadata()
