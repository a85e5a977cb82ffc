"""from_changelog behaviour beyond the spec's worked examples: errors, handling policies, state."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest
from helpers import FakeClock, dele, ins, ua, ub

from cdcflow import Change, Watermark, from_changelog
from cdcflow.core import (
    ChangelogDataError,
    ChangelogMetrics,
    ChangelogValidationError,
    FromChangelog,
    InvalidOperationError,
    NullKeyError,
    NullOperationError,
    Rejected,
    plan_from_changelog,
)

UPSERT_RETRACT = {"upsert": "INSERT, UPDATE_BEFORE, UPDATE_AFTER", "delete": "DELETE"}


def test_null_operation_fails_naming_record_and_field() -> None:
    rows = [{"op": "INSERT", "id": 1}, {"op": None, "id": 2}]
    with pytest.raises(NullOperationError, match=r"record #1, field 'op': the operation code is NULL"):
        list(from_changelog(rows))


def test_missing_operation_field_counts_as_null() -> None:
    with pytest.raises(NullOperationError):
        list(from_changelog([{"type": "INSERT", "id": 2}]))


def test_null_operation_fails_even_when_invalid_ops_are_skipped() -> None:
    with pytest.raises(NullOperationError):
        list(from_changelog([{"op": None, "id": 2}], invalid_op_handling="SKIP"))


def test_null_key_fails_naming_the_key_column() -> None:
    rows = [{"op": "INSERT", "id": None, "name": "x"}]
    with pytest.raises(NullKeyError, match=r"record #0, field 'id': the upsert key column is NULL"):
        list(from_changelog(rows, partition_by="id"))


def test_unknown_op_fails_by_default_listing_known_codes() -> None:
    with pytest.raises(
        InvalidOperationError, match=r"unknown operation code 'x'; op_mapping knows \['c', 'd'\]"
    ):
        list(from_changelog([{"op": "x", "id": 1}], op_mapping={"c": "INSERT", "d": "DELETE"}))


def test_log_skips_with_a_warning_and_hands_the_record_over(caplog: pytest.LogCaptureFixture) -> None:
    metrics = ChangelogMetrics()
    dead_letters: list[Rejected] = []
    rows = [{"op": "INSERT", "id": 1}, {"op": "TRUNCATE", "id": 2}, {"op": "DELETE", "id": 1}]
    with caplog.at_level(logging.WARNING, logger="cdcflow"):
        out = list(
            from_changelog(rows, invalid_op_handling="log", metrics=metrics, on_reject=dead_letters.append)
        )
    assert out == [ins(id=1), dele(id=1)]
    assert metrics.invalid_ops == 1
    assert [r.record for r in dead_letters] == [{"op": "TRUNCATE", "id": 2}]
    assert dead_letters[0].record_index == 1
    assert "unknown operation code 'TRUNCATE'" in caplog.text


def test_skip_does_not_log_but_still_counts(caplog: pytest.LogCaptureFixture) -> None:
    metrics = ChangelogMetrics()
    with caplog.at_level(logging.DEBUG, logger="cdcflow"):
        out = list(from_changelog([{"op": "?", "id": 1}], invalid_op_handling="SKIP", metrics=metrics))
    assert out == []
    assert caplog.text == ""
    assert metrics.invalid_ops == 1 and metrics.rejected[0].reason == "unknown operation code '?'"


def test_invalid_handling_value_is_rejected_listing_choices() -> None:
    with pytest.raises(ChangelogValidationError, match="use one of FAIL, LOG, SKIP"):
        from_changelog([], invalid_op_handling="IGNORE")


def test_boolean_deletion_flag_matches_string_codes() -> None:
    rows = [{"deleted": False, "id": 1, "v": "a"}, {"deleted": True, "id": 1, "v": "a"}]
    out = list(from_changelog(rows, op="deleted", op_mapping={"false": "INSERT", "true": "DELETE"}))
    assert out == [ins(id=1, v="a"), dele(id=1, v="a")]


def test_parameters_fail_at_the_call_before_any_row_is_read() -> None:
    def rows() -> Any:
        raise AssertionError("must not be read")
        yield

    with pytest.raises(ChangelogValidationError, match="set state_ttl"):
        from_changelog(rows(), op_mapping=UPSERT_RETRACT)


def test_stateful_mapping_without_key_is_rejected() -> None:
    with pytest.raises(ChangelogValidationError, match="set partition_by"):
        plan_from_changelog(op_mapping=UPSERT_RETRACT, state_ttl=timedelta(0))


def test_flat_update_pair_needs_state_or_a_before_field() -> None:
    with pytest.raises(ChangelogValidationError, match="no separate before image"):
        plan_from_changelog(op_mapping={"u": "UPDATE_BEFORE, UPDATE_AFTER"})
    with pytest.raises(ChangelogValidationError, match="no separate before image"):
        plan_from_changelog(
            before="payload", after="payload", op_mapping={"u": "UPDATE_BEFORE, UPDATE_AFTER"}
        )


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"op": ""}, "op must be a non-empty field name"),
        ({"before": "op"}, "before and op both name the field 'op'"),
        ({"after": "after", "passthrough": ["after"]}, "must not name before or after"),
        ({"passthrough": ["a", "a"]}, "lists a field twice"),
        ({"state_ttl": -1, "partition_by": "id"}, "must not be negative"),
        ({"state_ttl": "5m", "partition_by": "id"}, "must be a timedelta"),
        ({"consume_full_deletes": "yes"}, "must be True or False"),
    ],
)
def test_parameter_errors(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ChangelogValidationError, match=message):
        plan_from_changelog(**params)


def test_update_without_before_image_names_the_replica_identity_fix() -> None:
    rows = [{"op": "u", "before": None, "after": {"id": 1, "v": 2}}]
    with pytest.raises(ChangelogDataError, match="REPLICA IDENTITY FULL"):
        list(
            from_changelog(
                rows, before="before", after="after", op_mapping={"u": "UPDATE_BEFORE, UPDATE_AFTER"}
            )
        )


def test_stateful_update_without_before_image_uses_stored_image_then_insert() -> None:
    rows = [
        {"op": "u", "before": None, "after": {"id": 1, "v": 1}},
        {"op": "u", "before": None, "after": {"id": 1, "v": 2}},
        {"op": "u", "before": {"id": 1, "v": 20}, "after": {"id": 1, "v": 3}},
    ]
    out = list(
        from_changelog(
            rows,
            before="before",
            after="after",
            partition_by="id",
            state_ttl=0,
            op_mapping={"u": "UPDATE_BEFORE, UPDATE_AFTER"},
        )
    )
    # Unknown key and no before image: an insert (4.3.3); then the stored image; then the record's own.
    assert out == [ins(id=1, v=1), ub(id=1, v=1), ua(id=1, v=2), ub(id=1, v=20), ua(id=1, v=3)]


def test_image_that_is_not_a_row_fails() -> None:
    with pytest.raises(ChangelogDataError, match="field 'after': the image must be a row"):
        list(from_changelog([{"op": "INSERT", "after": "oops"}], after="after"))


def test_delete_with_null_before_falls_back_to_after_image() -> None:
    rows = [{"op": "DELETE", "before": None, "after": {"id": 3}}]
    assert list(from_changelog(rows, before="before", after="after")) == [dele(id=3)]


def test_passthrough_field_missing_from_record_fails() -> None:
    rows = [{"op": "INSERT", "after": {"id": 1}}]
    with pytest.raises(ChangelogDataError, match="passthrough field 'ts_ms' is not in the record"):
        list(from_changelog(rows, after="after", passthrough="ts_ms"))


def test_ttl_expiry_turns_an_update_into_an_insert_and_is_counted() -> None:
    clock = FakeClock(0)
    metrics = ChangelogMetrics()
    conversion = FromChangelog(
        plan_from_changelog(partition_by="id", state_ttl=timedelta(seconds=10), op_mapping=UPSERT_RETRACT),
        clock=clock,
        metrics=metrics,
    )
    assert conversion.process({"op": "upsert", "id": 1, "v": "a"}) == [ins(id=1, v="a")]
    clock.now = 9.5
    assert conversion.process({"op": "upsert", "id": 1, "v": "b"}) == [ub(id=1, v="a"), ua(id=1, v="b")]
    clock.now = 19.4  # 9.9 s after the last write: still alive
    assert conversion.process({"op": "upsert", "id": 1, "v": "c"}) == [ub(id=1, v="b"), ua(id=1, v="c")]
    clock.now = 29.4  # 10 s of inactivity: gone
    assert conversion.process({"op": "upsert", "id": 1, "v": "d"}) == [ins(id=1, v="d")]
    assert conversion._state is not None and conversion._state.expired == 1


def test_zero_ttl_keeps_state_forever() -> None:
    clock = FakeClock(0)
    rows = [{"op": "upsert", "id": 1, "v": "a"}, {"op": "upsert", "id": 1, "v": "b"}]

    def timed() -> Any:
        for step, row in enumerate(rows):
            clock.now = step * 10**9
            yield row

    out = list(
        from_changelog(
            timed(), partition_by="id", state_ttl=timedelta(0), clock=clock, op_mapping=UPSERT_RETRACT
        )
    )
    assert out == [ins(id=1, v="a"), ub(id=1, v="a"), ua(id=1, v="b")]


def test_order_by_sorts_within_watermarks_and_drops_late_rows() -> None:
    metrics = ChangelogMetrics()
    rows: list[Any] = [
        {"op": "INSERT", "id": 1, "t": 5},
        {"op": "INSERT", "id": 2, "t": 3},
        Watermark(4),
        {"op": "INSERT", "id": 3, "t": 2},  # late: below watermark 4
        {"op": "INSERT", "id": 4, "t": 4},  # at the watermark: not late
        Watermark(10),
    ]
    out = list(from_changelog(rows, order_by="t", metrics=metrics))
    assert out == [ins(id=2), ins(id=4), ins(id=1)]
    assert metrics.late_records == 1
    assert metrics.rejected[0].record == {"op": "INSERT", "id": 3, "t": 2}


def test_order_by_end_of_input_releases_everything_in_time_order() -> None:
    rows = [{"op": "INSERT", "id": i, "t": t} for i, t in enumerate([3, 1, 2])]
    assert [c.row["id"] for c in from_changelog(rows, order_by="t")] == [1, 2, 0]


def test_order_by_column_kept_when_passed_through() -> None:
    rows = [{"op": "INSERT", "id": 1, "t": 3}]
    assert list(from_changelog(rows, order_by="t", passthrough="t")) == [ins(id=1, t=3)]


def test_null_event_time_fails() -> None:
    with pytest.raises(ChangelogDataError, match="field 't': the ORDER BY time is NULL"):
        list(from_changelog([{"op": "INSERT", "id": 1, "t": None}], order_by="t"))


def test_watermark_compaction_of_insert_then_delete_emits_nothing() -> None:
    metrics = ChangelogMetrics()
    rows: list[Any] = [
        {"op": "INSERT", "id": 1, "t": 1},
        {"op": "DELETE", "id": 1, "t": 2},
        {"op": "INSERT", "id": 2, "t": 2},
        Watermark(5),
    ]
    assert list(from_changelog(rows, order_by="t", partition_by="id", metrics=metrics)) == [ins(id=2)]
    assert metrics.compacted_changes == 2


def test_watermark_compaction_of_retractions_keeps_the_first_before_image() -> None:
    rows: list[Any] = [
        {"op": "UPDATE_BEFORE", "id": 1, "v": "a", "t": 1},
        {"op": "UPDATE_AFTER", "id": 1, "v": "b", "t": 1},
        {"op": "UPDATE_BEFORE", "id": 1, "v": "b", "t": 2},
        {"op": "UPDATE_AFTER", "id": 1, "v": "c", "t": 2},
        Watermark(5),
    ]
    out = list(from_changelog(rows, order_by="t", partition_by="id"))
    assert out == [ub(id=1, v="a"), ua(id=1, v="c")]


@pytest.mark.parametrize(
    ("params", "record"),
    [
        ({}, {"op": "INSERT", "before": None, "after": {"id": 1}}),
        ({"partition_by": "id"}, {"op": "INSERT", "before": None, "after": {"id": None}}),
        ({"invalid_op_handling": "SKIP"}, {"op": "TRUNCATE", "before": None, "after": {"id": 1}}),
    ],
    ids=["plain", "null-key", "skipped-code"],
)
def test_process_images_is_process_of_the_envelope(params: dict[str, Any], record: dict[str, Any]) -> None:
    def outcome(feed: Any) -> tuple[Any, list[Rejected]]:
        rejected: list[Rejected] = []
        conversion = FromChangelog(
            plan_from_changelog(before="before", after="after", **params), on_reject=rejected.append
        )
        try:
            return feed(conversion), rejected
        except ChangelogDataError as error:
            return (type(error), str(error)), rejected

    expected = outcome(lambda c: c.process(record))
    assert outcome(lambda c: c.process_images(record["op"], record["before"], record["after"])) == expected


def test_changes_print_flink_style() -> None:
    assert str(Change.parse_kind("+I", {"id": 5, "name": "name"})) == "+I[5, name]"
    assert str(ub(id=5, w=1.0, ok=True, x=None)) == "-U[5, 1.0, true, null]"
