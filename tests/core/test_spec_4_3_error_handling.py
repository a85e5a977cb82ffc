"""Spec 4.3 Error handling (ORDER BY / watermarks / state_ttl, op_mapping, passthrough): every example
as a test (../shared/spec/000_*.txt).

Expected outputs are copied from the spec; where it contradicts itself or leaves a choice open we
follow docs/spec-notes.md and cite the note ("note N"). Rows are compared with their column order.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from helpers import (
    DEBEZIUM_MAPPING,
    At,
    FakeClock,
    Row,
    Tracked,
    assert_exact,
    dele,
    flat,
    ins,
    run_steps,
    t,
    ua,
    ub,
    wm,
)

from cdcflow import Change, from_changelog, to_changelog
from cdcflow.core import (
    CdcflowError,
    ChangelogMetrics,
    ChangelogValidationError,
    InvalidOperationError,
    NullKeyError,
    NullOperationError,
    OpMappingError,
)
from cdcflow.core.params import FROM_CHANGELOG_ARGUMENTS

WITH_INVALID_OP = [
    {"op": "INSERT", "id": 1, "name": "a"},
    {"op": "BOGUS", "id": 2, "name": "b"},
    {"op": "INSERT", "id": 3, "name": "c"},
]


def test_4_3_1_invalid_op_fail_is_the_default() -> None:
    with pytest.raises(InvalidOperationError, match="BOGUS"):
        list(from_changelog(WITH_INVALID_OP))
    with pytest.raises(InvalidOperationError, match="BOGUS"):
        list(from_changelog(WITH_INVALID_OP, invalid_op_handling="FAIL"))


def test_4_3_1_invalid_op_log_skips_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    metrics = ChangelogMetrics()
    out = list(from_changelog(WITH_INVALID_OP, invalid_op_handling="LOG", metrics=metrics))
    assert_exact(out, [ins(id=1, name="a"), ins(id=3, name="c")])
    warnings = [record for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "BOGUS" in warnings[0].getMessage()
    assert metrics.invalid_ops == 1
    assert [(r.record, r.record_index) for r in metrics.rejected] == [(WITH_INVALID_OP[1], 1)]  # note 10


def test_4_3_1_invalid_op_skip_is_silent(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    metrics = ChangelogMetrics()
    out = list(from_changelog(WITH_INVALID_OP, invalid_op_handling="SKIP", metrics=metrics))
    assert_exact(out, [ins(id=1, name="a"), ins(id=3, name="c")])
    assert [record for record in caplog.records if record.levelno >= logging.WARNING] == []
    # note 10: not logged, but counted and handed over
    assert metrics.invalid_ops == 1
    assert [(r.record, r.record_index) for r in metrics.rejected] == [(WITH_INVALID_OP[1], 1)]


def test_4_3_2_order_by_watermarks_and_state_ttl_together() -> None:
    metrics = ChangelogMetrics()
    late = {"op": "upsert", "id": 1, "name": "late", "ts": t("10:03")}
    emitted, _ = run_steps(
        from_changelog,
        [
            At("14:00", {"op": "upsert", "id": 2, "name": "b", "ts": t("10:02")}),
            At("14:00", {"op": "upsert", "id": 1, "name": "a", "ts": t("10:01")}),
            At("14:00", wm("10:05")),
            At("14:01", late),
            At("14:01", {"op": "upsert", "id": 1, "name": "a2", "ts": t("10:07")}),
            At("14:02", wm("10:10")),
        ],
        partition_by="id",
        order_by="ts",
        state_ttl=timedelta(minutes=10),
        op_mapping={"upsert": "INSERT, UPDATE_BEFORE, UPDATE_AFTER"},
        clock=FakeClock(),
        metrics=metrics,
    )
    assert_exact(
        emitted,
        [
            [],
            [],
            [ins(id=1, name="a"), ins(id=2, name="b")],  # reordered by ts
            [],  # late: dropped by the sorting operator
            [],
            [ub(id=1, name="a"), ua(id=1, name="a2")],  # -U from key state
            [],
        ],
    )
    assert metrics.late_records == 1
    assert [rejected.record for rejected in metrics.rejected] == [late]

    # Without ORDER BY, state_ttl alone: late data is processed normally.
    metrics = ChangelogMetrics()
    out = list(
        from_changelog(
            [wm("10:05"), late],
            partition_by="id",
            state_ttl=timedelta(minutes=10),
            op_mapping={"upsert": "INSERT, UPDATE_BEFORE, UPDATE_AFTER"},
            clock=FakeClock(),
            metrics=metrics,
        )
    )
    assert_exact(out, [ins(id=1, name="late", ts=t("10:03"))])
    assert metrics.late_records == 0

    # ORDER BY is FROM_CHANGELOG only
    assert "order_by" in FROM_CHANGELOG_ARGUMENTS
    with pytest.raises(TypeError, match="unexpected keyword argument 'order_by'"):
        to_changelog([], order_by="ts")


def test_4_3_3_ttl_expiry_from_changelog_emits_insert_instead_of_update() -> None:
    kwargs: dict[str, Any] = {
        "partition_by": "id",
        "op_mapping": {"c": "INSERT", "u": "UPDATE_BEFORE, UPDATE_AFTER"},
    }
    steps = [
        At("14:00", {"op": "c", "id": 1, "name": "a"}),
        At("14:06", {"op": "u", "id": 1, "name": "b"}),  # state of 14:00 expired at 14:05
        At("14:08", {"op": "u", "id": 1, "name": "c"}),  # state of 14:06 still alive
    ]
    emitted, _ = run_steps(from_changelog, steps, state_ttl=timedelta(minutes=5), clock=FakeClock(), **kwargs)
    assert_exact(
        emitted,
        [[ins(id=1, name="a")], [ins(id=1, name="b")], [ub(id=1, name="b"), ua(id=1, name="c")], []],
    )
    # INTERVAL '0' keeps state forever
    steps = [At("14:00", {"op": "c", "id": 1, "name": "a"}), At("23:59", {"op": "u", "id": 1, "name": "b"})]
    emitted, _ = run_steps(from_changelog, steps, state_ttl=timedelta(0), clock=FakeClock(), **kwargs)
    assert_exact(flat(emitted), [ins(id=1, name="a"), ub(id=1, name="a"), ua(id=1, name="b")])


def test_4_3_3_ttl_expiry_to_changelog_drops_pending_update_before() -> None:
    kwargs: dict[str, Any] = {
        "partition_by": "id",
        "before": "before",
        "after": "after",
        "state_ttl": timedelta(minutes=5),
        "op_mapping": {"INSERT": "INSERT", "DELETE": "DELETE", "UPDATE_BEFORE, UPDATE_AFTER": "UPDATE"},
        "clock": FakeClock(),
    }
    emitted, _ = run_steps(
        to_changelog, [At("14:00", ub(id=1, val=10)), At("14:06", ua(id=1, val=20))], **kwargs
    )
    # note 6: the expired -U is dropped, the +U is written with the INSERT code
    assert_exact(emitted, [[], [{"op": "INSERT", "before": None, "after": {"id": 1, "val": 20}}], []])


PAIRING = {
    "before": "before",
    "after": "after",
    "op_mapping": {"INSERT": "c", "DELETE": "d", "UPDATE_BEFORE, UPDATE_AFTER": "u"},
}


def test_4_3_4_pairing_with_state_ttl_waits_for_the_update_after() -> None:
    emitted, _ = run_steps(
        to_changelog,
        [At("14:00", ub(id=1, val=10)), At("14:01", ins(id=2, val=5)), At("14:02", ua(id=1, val=20))],
        partition_by="id",
        state_ttl=timedelta(minutes=5),
        clock=FakeClock(),
        **PAIRING,
    )
    assert_exact(
        emitted,
        [
            [],
            [{"op": "c", "before": None, "after": {"id": 2, "val": 5}}],  # another key is not held back
            [{"op": "u", "before": {"id": 1, "val": 10}, "after": {"id": 1, "val": 20}}],
            [],
        ],
    )


@pytest.mark.parametrize("state_ttl", [None, timedelta(minutes=5)], ids=["watermarks", "watermarks-and-ttl"])
def test_4_3_4_pairing_with_watermarks_waits_for_the_watermark(state_ttl: timedelta | None) -> None:
    emitted, _ = run_steps(
        to_changelog,
        [
            wm("10:00"),
            ub(id=1, val=10, event_time=t("10:01")),
            ua(id=1, val=20, event_time=t("10:01")),
            wm("10:02"),
        ],
        partition_by="id",
        on_time="event_time",
        state_ttl=state_ttl,
        clock=FakeClock(),
        **PAIRING,
    )
    update = {
        "op": "u",
        "before": {"id": 1, "val": 10},  # the on_time column stays out of the images (4.2.1.3.2)
        "after": {"id": 1, "val": 20},
    }
    assert_exact(emitted, [[], [], [], [update], []])


def test_4_3_4_pairing_with_neither() -> None:
    # note 6: -U is buffered (one global key without partition_by) and combined with the +U that follows it
    emitted, _ = run_steps(to_changelog, [ub(id=1, val=10), ua(id=1, val=20)], **PAIRING)
    assert_exact(
        emitted, [[], [{"op": "u", "before": {"id": 1, "val": 10}, "after": {"id": 1, "val": 20}}], []]
    )

    # note 6: a -U followed by anything but its +U is written on its own; the +U then has no before image
    # and is written with the INSERT code
    out = list(to_changelog([ub(id=1, val=10), ins(id=2, val=5), ua(id=1, val=20)], **PAIRING))
    assert_exact(
        out,
        [
            {"op": "u", "before": {"id": 1, "val": 10}, "after": None},
            {"op": "c", "before": None, "after": {"id": 2, "val": 5}},
            {"op": "c", "before": None, "after": {"id": 1, "val": 20}},
        ],
    )


@pytest.mark.parametrize("handling", ["FAIL", "LOG", "SKIP"])
def test_4_3_5_null_operation_fails(handling: str) -> None:
    # Fails whatever invalid_op_handling says: a NULL code is corrupt data, not an unknown code.
    rows = [{"__op": "INSERT", "id": 1}, {"__op": None, "id": 2}]
    with pytest.raises(NullOperationError) as error:
        list(from_changelog(rows, op="__op", invalid_op_handling=handling))
    message = str(error.value)
    assert "null" in message.lower()
    assert "__op" in message


def test_4_3_5_null_key_fails() -> None:
    with pytest.raises(NullKeyError) as error:
        list(from_changelog([{"op": "UPDATE_AFTER", "user_id": None, "name": "x"}], partition_by="user_id"))
    assert "user_id" in str(error.value)
    assert "null" in str(error.value).lower()

    with pytest.raises(NullKeyError) as error:
        list(to_changelog([dele(user_id=None, name="x")], partition_by="user_id"))
    assert "user_id" in str(error.value)
    assert "null" in str(error.value).lower()


ROW_KIND_NAMES_RULE = r"(?i)(row ?kind) names? must be valid"


def _assert_rejected_at_planning(convert: Callable[..., Iterator[Any]], op_mapping: Any, rule: str) -> None:
    source = Tracked([{"op": "x", "id": 1}] if convert is from_changelog else [ins(id=1)])
    with pytest.raises(OpMappingError, match=rule):
        list(convert(source, op_mapping=op_mapping))
    assert source.pulled == 0  # fails before the job starts


@pytest.mark.parametrize(
    ("convert", "op_mapping"),
    [
        (from_changelog, {"c": "INSRT"}),
        (to_changelog, {"INSRT": "c"}),
        (to_changelog, {("INSERT", "UPDATE"): ["u"]}),
    ],
)
def test_4_3_6_invalid_op_mapping_rowkind_names_must_be_valid(convert: Any, op_mapping: Any) -> None:
    _assert_rejected_at_planning(convert, op_mapping, rule=ROW_KIND_NAMES_RULE)


@pytest.mark.parametrize(
    ("convert", "op_mapping"),
    [
        (from_changelog, {"c": "INSERT", "r": "INSERT"}),
        (from_changelog, {"d": "DELETE", "del": "DELETE"}),
        (to_changelog, {"INSERT": "c", "INSERT, UPDATE_AFTER": "upsert"}),
        (to_changelog, [(["DELETE"], ["d"]), (["DELETE"], ["x"])]),
    ],
)
def test_4_3_6_invalid_op_mapping_rowkind_at_most_once(convert: Any, op_mapping: Any) -> None:
    _assert_rejected_at_planning(convert, op_mapping, rule="at most once")


@pytest.mark.parametrize(
    ("convert", "op_mapping"),
    [
        (from_changelog, {"x": "INSERT, DELETE"}),
        (from_changelog, {"x": "UPDATE_BEFORE, DELETE"}),
        (from_changelog, {"x": "INSERT, UPDATE_BEFORE"}),
        (to_changelog, {"INSERT, DELETE": "x"}),
        (to_changelog, {"UPDATE_AFTER, DELETE": "x"}),
    ],
)
def test_4_3_6_invalid_op_mapping_incompatible_grouping(convert: Any, op_mapping: Any) -> None:
    _assert_rejected_at_planning(convert, op_mapping, rule="compatible")


@pytest.mark.parametrize("convert", [from_changelog, to_changelog])
def test_4_3_6_invalid_op_mapping_example_no_side_names_row_kinds(convert: Any) -> None:
    # MAP['MY_INSERT', 'NEW_INSERT']: one side must hold Flink's row kind names
    _assert_rejected_at_planning(convert, {"MY_INSERT": "NEW_INSERT"}, rule=ROW_KIND_NAMES_RULE)


@pytest.mark.parametrize(
    ("op_mapping", "extra", "record", "expected"),
    [
        ({"x": "UPDATE_BEFORE"}, {}, {"op": "x", "id": 1}, [ub(id=1)]),
        ({"x": "DELETE", "y": "INSERT"}, {}, {"op": "y", "id": 1}, [ins(id=1)]),
        (
            {"u": "UPDATE_BEFORE, UPDATE_AFTER"},
            {"before": "before", "after": "after"},
            {"op": "u", "before": {"id": 1}, "after": {"id": 2}},
            [ub(id=1), ua(id=2)],
        ),
        (
            {"up": "INSERT, UPDATE_AFTER"},
            {"state_ttl": 60, "partition_by": "id"},
            {"op": "up", "id": 1},
            [ins(id=1)],
        ),
        (
            {"up": "INSERT, UPDATE_BEFORE, UPDATE_AFTER"},
            {"state_ttl": 60, "partition_by": "id"},
            {"op": "up", "id": 1},
            [ins(id=1)],
        ),
    ],
    ids=["single", "codes", "update-before-after", "insert-update-after", "insert-update-before-after"],
)
def test_4_3_6_valid_groupings_are_accepted(
    op_mapping: Any, extra: Row, record: Row, expected: list[Change]
) -> None:
    assert_exact(list(from_changelog([record], op_mapping=op_mapping, clock=FakeClock(), **extra)), expected)


def test_4_3_6_valid_grouping_to_changelog() -> None:
    out = list(
        to_changelog(
            [ins(id=1), ua(id=1), dele(id=1)],
            op_mapping={"INSERT, UPDATE_AFTER": "upsert", "DELETE": "delete"},
        )
    )
    assert_exact(out, [{"op": "upsert", "id": 1}, {"op": "upsert", "id": 1}, {"op": "delete", "id": 1}])


def test_4_3_7_passthrough_name_conflicts_with_image_field() -> None:
    rows = [{"op": "c", "ts_ms": 1234, "before": None, "after": {"id": 1, "ts_ms": 99}}]
    with pytest.raises(CdcflowError) as error:
        list(
            from_changelog(
                rows, before="before", after="after", passthrough="ts_ms", op_mapping=DEBEZIUM_MAPPING
            )
        )
    assert "passthrough" in str(error.value)
    assert "ts_ms" in str(error.value)

    # Naming the image field itself is caught at planning time, before any record.
    for convert, record in ((from_changelog, rows[0]), (to_changelog, ins(id=1))):
        source = Tracked([record])
        with pytest.raises(ChangelogValidationError, match="passthrough") as error:
            list(convert(source, before="before", after="after", passthrough="after"))
        assert "after" in str(error.value)
        assert source.pulled == 0


def test_4_3_7_passthrough_field_missing_from_record_fails() -> None:
    # note 3
    rows = [{"op": "c", "before": None, "after": {"id": 1, "name": "Alice"}}]
    with pytest.raises(CdcflowError, match="ts_ms"):
        list(
            from_changelog(
                rows, before="before", after="after", passthrough="ts_ms", op_mapping=DEBEZIUM_MAPPING
            )
        )


def test_4_3_7_passthrough_without_before_after_is_a_no_op() -> None:
    rows = [{"op": "INSERT", "ts_ms": 1234, "id": 1}]
    with_passthrough = list(from_changelog(rows, passthrough="ts_ms"))
    assert_exact(with_passthrough, [ins(ts_ms=1234, id=1)])
    assert_exact(with_passthrough, list(from_changelog(rows)))

    changes = [ins(ts_ms=1234, id=1)]  # ts_ms first: note 8 (op, passthrough, columns) and "no effect" agree
    with_passthrough_records = list(to_changelog(changes, passthrough="ts_ms"))
    assert_exact(with_passthrough_records, [{"op": "INSERT", "ts_ms": 1234, "id": 1}])
    assert_exact(with_passthrough_records, list(to_changelog(changes)))
