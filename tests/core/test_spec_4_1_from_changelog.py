"""Spec 4.1 FROM_CHANGELOG: every example as a test (../shared/spec/000_*.txt).

Expected outputs are copied from the spec; where it contradicts itself or leaves a choice open we
follow docs/spec-notes.md and cite the note ("note N"). Rows are compared with their column order.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from helpers import (
    DEBEZIUM_MAPPING,
    RETRACT_KINDS,
    UPSERT_KINDS,
    At,
    FakeClock,
    Row,
    Tracked,
    assert_exact,
    dele,
    flat,
    ins,
    materialize,
    run_steps,
    stored_images,
    t,
    ua,
    ub,
    wall,
    wm,
)

from cdcflow import from_changelog
from cdcflow.core import (
    ChangelogDataError,
    ChangelogMetrics,
    ChangelogValidationError,
    InMemoryStateStore,
    plan_from_changelog,
)


def test_4_1_1_default_signature() -> None:
    rows = [
        {"op": "INSERT", "id": 5, "name": "name"},
        {"op": "DELETE", "id": 5, "name": "name"},
    ]
    out = list(from_changelog(rows))
    assert_exact(out, [ins(id=5, name="name"), dele(id=5, name="name")])
    assert [str(change) for change in out] == ["+I[5, name]", "-D[5, name]"]
    assert materialize(out) == []  # Table: empty


def test_4_1_2_1_1_flat_records_with_custom_header() -> None:
    rows = [
        {"type": "INSERT", "id": 5, "name": "name"},
        {"type": "DELETE", "id": 5, "name": "name"},
    ]
    out = list(from_changelog(rows, op="type"))
    assert_exact(out, [ins(id=5, name="name"), dele(id=5, name="name")])
    assert materialize(out) == []


@pytest.mark.parametrize(
    "op_mapping",
    [
        {"u": "UPDATE_BEFORE, UPDATE_AFTER"},  # MAP form
        {("u",): ["UPDATE_BEFORE", "UPDATE_AFTER"]},  # ARRAY form
        [(["u"], ["UPDATE_BEFORE", "UPDATE_AFTER"])],  # ARRAY form as pairs
    ],
    ids=["map", "array", "array-pairs"],
)
def test_4_1_2_1_2_update_before_after_nesting(op_mapping: Any) -> None:
    rows = [{"op": "u", "before": {"id": 5, "name": "old"}, "after": {"id": 5, "name": "new"}}]
    out = list(from_changelog(rows, before="before", after="after", op_mapping=op_mapping))
    assert_exact(out, [ub(id=5, name="old"), ua(id=5, name="new")])
    assert materialize(out, initial=[{"id": 5, "name": "old"}]) == [{"id": 5, "name": "new"}]


def test_4_1_2_2_1_ordering_with_watermarks_and_late_records() -> None:
    record_a = {"op": "INSERT", "id": 6, "name": "A", "event_time": t("10:05")}
    record_b = {"op": "INSERT", "id": 5, "name": "B", "event_time": t("09:55")}
    record_c = {"op": "INSERT", "id": 7, "name": "C", "event_time": t("10:11")}
    metrics = ChangelogMetrics()
    emitted, _ = run_steps(
        from_changelog,
        [wm("10:00"), record_a, record_b, record_c, wm("10:06")],
        partition_by="id",
        order_by="event_time",
        metrics=metrics,
        clock=FakeClock(),
    )
    # The ORDER BY column is not in the output rows, as in the outputs of 4.1.2.2.3 and 4.2.1.3.2 (no note).
    assert_exact(
        emitted,
        [
            [],
            [],  # A: buffered, emitted only when the watermark passes 10:05
            [],  # B: dropped, 09:55 < 10:00
            [],  # C: buffered
            [ins(id=6, name="A")],  # watermark 10:06: A emitted, C still buffered
            [ins(id=7, name="C")],  # end of input acts as a final watermark
        ],
    )
    # note 10: the late record is counted and handed over, never dropped without a trace
    assert metrics.late_records == 1
    assert [rejected.record for rejected in metrics.rejected] == [record_b]
    assert "late" in metrics.rejected[0].reason.lower()


def test_4_1_2_2_2_upsert_with_ttl() -> None:
    store = InMemoryStateStore()
    emitted, states = run_steps(
        from_changelog,
        [
            At("14:00", {"op": "upsert", "id": 99, "name": "Orphan"}),
            At("14:03", {"op": "upsert", "id": 99, "name": "Orphan Updated"}),
            At("14:05", {"op": "delete", "id": 99, "name": "Orphan Updated"}),
            At("14:10", {"op": "upsert", "id": 99, "name": "Resurrected"}),
            # Not in the spec's listing: at 15:00 the state is "CLEARED by TTL", which a record shows.
            At("15:00", {"op": "upsert", "id": 99, "name": "After TTL"}),
        ],
        probe=lambda: stored_images(store),
        partition_by="id",
        uid="upsert-unzip-example",
        state_ttl=timedelta(minutes=5),
        op_mapping={"upsert": "INSERT, UPDATE_BEFORE, UPDATE_AFTER", "delete": "DELETE"},
        clock=FakeClock(),
        state_store=store,
    )
    assert_exact(
        emitted,
        [
            [ins(id=99, name="Orphan")],
            [ub(id=99, name="Orphan"), ua(id=99, name="Orphan Updated")],
            [dele(id=99, name="Orphan Updated")],
            [ins(id=99, name="Resurrected")],
            [ins(id=99, name="After TTL")],  # state expired at 14:15: the key is unseen again
            [],
        ],
    )
    assert states == [
        [({"id": 99, "name": "Orphan"}, wall("14:05"))],
        [({"id": 99, "name": "Orphan Updated"}, wall("14:08"))],
        [],  # CLEARED
        [({"id": 99, "name": "Resurrected"}, wall("14:15"))],
        [({"id": 99, "name": "After TTL"}, wall("15:05"))],
    ]


OUT_OF_ORDER_UPDATES = [
    {"op": "INSERT", "id": 5, "name": "A", "event_time": t("09:55")},
    wm("09:50"),
    {"op": "UPDATE_AFTER", "id": 5, "name": "Updated A", "event_time": t("09:57")},
    wm("09:52"),
    {"op": "UPDATE_AFTER", "id": 5, "name": "Between updates A", "event_time": t("09:56")},
    wm("09:52"),
    {"op": "INSERT", "id": 6, "name": "B", "event_time": t("10:20")},
    wm("10:15"),
]


def test_4_1_2_2_3_watermark_compaction_with_order_by() -> None:
    emitted, _ = run_steps(
        from_changelog, OUT_OF_ORDER_UPDATES, partition_by="id", order_by="event_time", clock=FakeClock()
    )
    # As the spec shows, the ORDER BY column (event_time) is not part of the output row.
    assert_exact(
        emitted,
        [
            [], [], [], [], [], [], [],
            # watermark 10:15: the sort operator releases A, Between updates A, Updated A; compacted (note 9)
            [ins(id=5, name="Updated A")],
            [ins(id=6, name="B")],  # end of input
        ],
    )  # fmt: skip


def test_4_1_2_2_3_without_order_by_emits_in_arrival_order() -> None:
    # note 11: the spec's listing cannot come from this input; arrival order, no compaction
    out = list(from_changelog(OUT_OF_ORDER_UPDATES, partition_by="id", clock=FakeClock()))
    assert_exact(
        out,
        [
            ins(id=5, name="A", event_time=t("09:55")),
            ua(id=5, name="Updated A", event_time=t("09:57")),
            ua(id=5, name="Between updates A", event_time=t("09:56")),
            ins(id=6, name="B", event_time=t("10:20")),
        ],
    )


CDC_MAPPING = {"c": "INSERT", "d": "DELETE", "u": "UPDATE_AFTER"}


def test_4_1_2_3_1_consuming_partial_deletes() -> None:
    kwargs: dict[str, Any] = {
        "partition_by": "id",
        "uid": "partial-delete-example",
        "op_mapping": CDC_MAPPING,
    }
    assert_exact(list(from_changelog([{"op": "d", "id": 5}], **kwargs)), [dele(id=5)])
    assert plan_from_changelog(**kwargs).output_mode.key_only_deletes is True


def test_4_1_2_3_2_consuming_full_deletes() -> None:
    kwargs: dict[str, Any] = {
        "partition_by": "id",
        "uid": "full-delete-example",
        "consume_full_deletes": True,
        "op_mapping": CDC_MAPPING,
    }
    out = list(from_changelog([{"op": "d", "id": 5, "name": "Alice", "age": 30}], **kwargs))
    assert_exact(out, [dele(id=5, name="Alice", age=30)])
    assert plan_from_changelog(**kwargs).output_mode.key_only_deletes is False


def test_4_1_2_4_1_passthrough_debezium_metadata() -> None:
    rows = [{"op": "c", "ts_ms": 1234, "before": None, "after": {"id": 1, "name": "Alice"}}]
    out = list(
        from_changelog(
            rows,
            partition_by="id",
            before="before",
            after="after",
            passthrough="ts_ms",
            op_mapping=DEBEZIUM_MAPPING,
        )
    )
    # Output schema: [...fields from before/after..., ...passthrough fields...]
    assert_exact(out, [ins(id=1, name="Alice", ts_ms=1234)])


def test_4_1_2_5_complete_signature() -> None:
    # No data in the spec: one key through create, update and delete, a watermark after each record.
    def envelope(op: str, when: str, before: Row | None, after: Row | None, n: int) -> Row:
        return {
            "op": op,
            "event_time": t(when),
            "field1": f"f{n}",
            "field2": n,
            "before": before,
            "after": after,
        }

    emitted, _ = run_steps(
        from_changelog,
        [
            envelope("c", "10:01", None, {"id": 1, "name": "A"}, 1),
            wm("10:02"),
            envelope("u", "10:03", {"id": 1, "name": "A"}, {"id": 1, "name": "B"}, 2),
            wm("10:04"),
            envelope("d", "10:05", {"id": 1, "name": "B"}, None, 3),
            wm("10:06"),
        ],
        partition_by="id",
        order_by="event_time",
        uid="my-cdc-ptf",
        before="before",
        after="after",
        op="op",
        state_ttl=timedelta(minutes=10),
        consume_full_deletes=False,
        passthrough=["field1", "field2"],
        op_mapping={"c, r": "INSERT", "d": "DELETE", "u": "UPDATE_BEFORE, UPDATE_AFTER"},
        invalid_op_handling="FAIL",
        clock=FakeClock(),
    )
    assert_exact(
        emitted,
        [
            [],
            [ins(id=1, name="A", field1="f1", field2=1)],
            [],
            [ub(id=1, name="A", field1="f2", field2=2), ua(id=1, name="B", field1="f2", field2=2)],
            [],
            [dele(id=1, name="B", field1="f3", field2=3)],
            [],
        ],
    )


# 4.1.3 use cases: the spec shows only signatures; each gets a small input showing its output mode and
# whether it needs state. "State: not required" is checked by handing over a state store that stays empty.


def test_4_1_3_1_upsert_stream_to_upsert_stream() -> None:
    store = InMemoryStateStore()
    kwargs: dict[str, Any] = {
        "partition_by": "id",
        "uid": "my-cdc-ptf",
        "op": "__op",
        "op_mapping": {"c, r": "INSERT", "d": "DELETE", "u": "UPDATE_AFTER"},
    }
    rows = [
        {"__op": "r", "id": 1, "name": "a"},
        {"__op": "c", "id": 2, "name": "b"},
        {"__op": "u", "id": 1, "name": "a2"},
        {"__op": "d", "id": 2, "name": "b"},
    ]
    out = list(from_changelog(rows, state_store=store, **kwargs))
    assert_exact(out, [ins(id=1, name="a"), ins(id=2, name="b"), ua(id=1, name="a2"), dele(id=2, name="b")])
    assert plan_from_changelog(**kwargs).output_mode.kinds == UPSERT_KINDS
    assert len(store) == 0  # updates are emitted directly as UPDATE_AFTER, no state


BEFORE_AFTER_ROWS = [
    {"op": "c", "before": None, "after": {"id": 1, "name": "a"}},
    {"op": "u", "before": {"id": 1, "name": "a"}, "after": {"id": 1, "name": "b"}},
    {"op": "d", "before": {"id": 1, "name": "b"}, "after": None},
]


def test_4_1_3_2_retract_stream_to_retract_stream_with_before_after() -> None:
    store = InMemoryStateStore()
    kwargs: dict[str, Any] = {
        "partition_by": "id",
        "uid": "my-cdc-ptf",
        "before": "before",
        "after": "after",
        "op_mapping": {"c, r": "INSERT", "d": "DELETE", "u": "UPDATE_BEFORE, UPDATE_AFTER"},
    }
    out = list(from_changelog(BEFORE_AFTER_ROWS, state_store=store, **kwargs))
    assert_exact(out, [ins(id=1, name="a"), ub(id=1, name="a"), ua(id=1, name="b"), dele(id=1, name="b")])
    assert plan_from_changelog(**kwargs).output_mode.kinds == RETRACT_KINDS
    assert len(store) == 0  # no state_ttl: the input has both images (note 1)


def test_4_1_3_3_retract_stream_to_upsert_stream_with_before_after() -> None:
    store = InMemoryStateStore()
    kwargs: dict[str, Any] = {
        "partition_by": "id",
        "uid": "my-cdc-ptf",
        "before": "before",
        "after": "after",
        "op_mapping": DEBEZIUM_MAPPING,
    }
    out = list(from_changelog(BEFORE_AFTER_ROWS, state_store=store, **kwargs))
    assert_exact(out, [ins(id=1, name="a"), ua(id=1, name="b"), dele(id=1, name="b")])  # before image ignored
    assert plan_from_changelog(**kwargs).output_mode.kinds == UPSERT_KINDS
    assert len(store) == 0


AFTER_ONLY_ROWS = [
    {"op": "c", "before": None, "after": {"id": 1, "name": "a"}},
    {"op": "u", "before": None, "after": {"id": 1, "name": "b"}},
    {"op": "d", "before": {"id": 1, "name": "b"}, "after": None},
]


def test_4_1_3_4_upsert_stream_to_upsert_stream_with_before_after() -> None:
    store = InMemoryStateStore()
    kwargs: dict[str, Any] = {
        "partition_by": "id",
        "uid": "my-cdc-ptf",
        "before": "before",
        "after": "after",
        "op_mapping": DEBEZIUM_MAPPING,
    }
    out = list(from_changelog(AFTER_ONLY_ROWS, state_store=store, **kwargs))
    assert_exact(out, [ins(id=1, name="a"), ua(id=1, name="b"), dele(id=1, name="b")])
    assert plan_from_changelog(**kwargs).output_mode.kinds == UPSERT_KINDS
    assert len(store) == 0


def test_4_1_3_5_consuming_partial_deletes_from_upsert_source() -> None:
    store = InMemoryStateStore()
    kwargs: dict[str, Any] = {
        "partition_by": "id",
        "uid": "partial-delete-consumer",
        "op_mapping": CDC_MAPPING,
    }
    out = list(from_changelog([{"op": "d", "id": 5}], state_store=store, **kwargs))
    assert_exact(out, [dele(id=5)])
    mode = plan_from_changelog(**kwargs).output_mode
    assert (mode.kinds, mode.key_only_deletes) == (UPSERT_KINDS, True)
    assert len(store) == 0  # partial deletes are forwarded as-is


def test_4_1_3_6_consuming_full_deletes_from_cdc_source() -> None:
    store = InMemoryStateStore()
    kwargs: dict[str, Any] = {
        "partition_by": "id",
        "uid": "full-delete-consumer",
        "consume_full_deletes": True,
        "op_mapping": CDC_MAPPING,
    }
    out = list(
        from_changelog([{"op": "d", "id": 5, "name": "Alice", "age": 30}], state_store=store, **kwargs)
    )
    assert_exact(out, [dele(id=5, name="Alice", age=30)])
    assert plan_from_changelog(**kwargs).output_mode.key_only_deletes is False
    assert len(store) == 0


DELETION_FLAG_ROWS = [
    {"deleted": "false", "id": 1, "name": "a"},
    {"deleted": "false", "id": 1, "name": "b"},
    {"deleted": "true", "id": 1, "name": "b"},
]


def _run_with_state(rows: list[Row], **kwargs: Any) -> tuple[list[list[Any]], list[int]]:
    """Run with a 10-minute state TTL; also returns how many keys the store held after each row."""
    store = InMemoryStateStore()
    return run_steps(
        from_changelog,
        rows,
        probe=lambda: len(store),
        state_store=store,
        state_ttl=timedelta(minutes=10),
        clock=FakeClock(),
        **kwargs,
    )


def _assert_needs_state(rows: list[Row], **kwargs: Any) -> None:
    """Without state_ttl the mapping is rejected at planning time, asking for state_ttl (note 1)."""
    source = Tracked(rows)
    with pytest.raises(ChangelogValidationError, match="state_ttl") as error:
        list(from_changelog(source, **kwargs))
    assert "partition_by" in str(error.value)
    assert source.pulled == 0


def test_4_1_3_7_upsert_stream_to_retract_stream_with_deletion_flag() -> None:
    kwargs: dict[str, Any] = {
        "partition_by": "id",
        "uid": "my-cdc-ptf",
        "op": "deleted",
        "op_mapping": {"false": "INSERT, UPDATE_BEFORE, UPDATE_AFTER", "true": "DELETE"},
    }
    emitted, states = _run_with_state(DELETION_FLAG_ROWS, **kwargs)
    assert_exact(
        flat(emitted), [ins(id=1, name="a"), ub(id=1, name="a"), ua(id=1, name="b"), dele(id=1, name="b")]
    )
    assert states[:2] == [1, 1]  # the key's image is stored to produce the -U
    assert plan_from_changelog(state_ttl=timedelta(minutes=10), **kwargs).output_mode.kinds == RETRACT_KINDS
    _assert_needs_state(DELETION_FLAG_ROWS, **kwargs)


def test_4_1_3_8_upsert_stream_to_upsert_stream_with_deletion_flag() -> None:
    kwargs: dict[str, Any] = {
        "partition_by": "id",
        "uid": "my-cdc-ptf",
        "op": "deleted",
        "op_mapping": {"false": "INSERT, UPDATE_AFTER", "true": "DELETE"},
    }
    emitted, states = _run_with_state(DELETION_FLAG_ROWS, **kwargs)
    assert_exact(flat(emitted), [ins(id=1, name="a"), ua(id=1, name="b"), dele(id=1, name="b")])
    assert states[:2] == [1, 1]  # the key is remembered to tell INSERT from UPDATE_AFTER
    assert plan_from_changelog(state_ttl=timedelta(minutes=10), **kwargs).output_mode.kinds == UPSERT_KINDS
    _assert_needs_state(DELETION_FLAG_ROWS, **kwargs)


def test_4_1_3_9_upsert_stream_to_retract_stream() -> None:
    kwargs: dict[str, Any] = {
        "partition_by": "id",
        "uid": "my-cdc-ptf",
        "op": "__op",
        "op_mapping": {"c, r": "INSERT", "d": "DELETE", "u": "UPDATE_BEFORE, UPDATE_AFTER"},
    }
    rows = [
        {"__op": "c", "id": 1, "name": "a"},
        {"__op": "u", "id": 1, "name": "b"},
        {"__op": "d", "id": 1, "name": "b"},
    ]
    emitted, states = _run_with_state(rows, **kwargs)
    assert_exact(
        flat(emitted), [ins(id=1, name="a"), ub(id=1, name="a"), ua(id=1, name="b"), dele(id=1, name="b")]
    )
    assert states[:2] == [1, 1]
    assert plan_from_changelog(state_ttl=timedelta(minutes=10), **kwargs).output_mode.kinds == RETRACT_KINDS
    _assert_needs_state(rows, **kwargs)


def test_4_1_3_10_upsert_stream_to_retract_stream_with_before_after() -> None:
    kwargs: dict[str, Any] = {
        "partition_by": "id",
        "uid": "my-cdc-ptf",
        "before": "before",
        "after": "after",
        "op_mapping": {"c, r": "INSERT", "d": "DELETE", "u": "UPDATE_BEFORE, UPDATE_AFTER"},
    }
    emitted, states = _run_with_state(AFTER_ONLY_ROWS, **kwargs)
    # The -U comes from the stored image, since the update's before is null (note 2).
    assert_exact(
        flat(emitted), [ins(id=1, name="a"), ub(id=1, name="a"), ua(id=1, name="b"), dele(id=1, name="b")]
    )
    assert states[:2] == [1, 1]


def test_4_1_3_10_without_state_an_update_without_before_image_fails() -> None:
    # 4.1.3.10 says state is required: without state_ttl an update whose before image is NULL cannot
    # produce its -U row, so it fails with the fix instead of guessing (note 2).
    kwargs: dict[str, Any] = {
        "partition_by": "id",
        "before": "before",
        "after": "after",
        "op_mapping": {"c, r": "INSERT", "d": "DELETE", "u": "UPDATE_BEFORE, UPDATE_AFTER"},
    }
    with pytest.raises(
        ChangelogDataError, match=r"record #1, field 'before'.*REPLICA IDENTITY FULL.*state_ttl"
    ):
        list(from_changelog(AFTER_ONLY_ROWS, **kwargs))


def test_4_1_3_11_cdc_stream_with_envelope_metadata_passthrough() -> None:
    kwargs: dict[str, Any] = {
        "before": "before",
        "after": "after",
        "passthrough": "ts_ms",
        "op_mapping": DEBEZIUM_MAPPING,
    }
    # The spec's input has no tenant_id, one of its PARTITION BY columns (a NULL key, 4.3.5): like note 12,
    # the exact input/output pair runs without partition_by.
    rows = [{"op": "c", "ts_ms": 1234, "before": None, "after": {"user_id": 1, "name": "Alice"}}]
    assert_exact(list(from_changelog(rows, **kwargs)), [ins(user_id=1, name="Alice", ts_ms=1234)])

    # With the composite key present: an upsert stream with ts_ms carried on every row, no state.
    store = InMemoryStateStore()
    alice = {"user_id": 1, "tenant_id": 7, "name": "Alice"}
    alicia = {"user_id": 1, "tenant_id": 7, "name": "Alicia"}
    rows = [
        {"op": "r", "ts_ms": 1, "before": None, "after": alice},
        {"op": "u", "ts_ms": 2, "before": alice, "after": alicia},
        {"op": "d", "ts_ms": 3, "before": alicia, "after": None},
    ]
    out = list(from_changelog(rows, partition_by=["user_id", "tenant_id"], state_store=store, **kwargs))
    assert_exact(out, [ins(**alice, ts_ms=1), ua(**alicia, ts_ms=2), dele(**alicia, ts_ms=3)])
    assert len(store) == 0
