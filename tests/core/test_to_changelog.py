"""to_changelog behaviour beyond the spec's worked examples."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from helpers import FakeClock, dele, ins, ua, ub

from cdcflow import Watermark, to_changelog
from cdcflow.core import (
    ChangelogDataError,
    ChangelogMetrics,
    ChangelogValidationError,
    NullKeyError,
    ToChangelog,
)
from cdcflow.core.params import plan_to_changelog

DEBEZIUM = {"INSERT": "c", "UPDATE_BEFORE, UPDATE_AFTER": "u", "DELETE": "d"}


def test_default_flat_output_puts_op_first_and_drops_update_before() -> None:
    out = list(to_changelog([ins(id=1, v="a"), ub(id=1, v="a"), ua(id=1, v="b"), dele(id=1, v="b")]))
    assert out == [
        {"op": "INSERT", "id": 1, "v": "a"},
        {"op": "UPDATE_AFTER", "id": 1, "v": "b"},
        {"op": "DELETE", "id": 1, "v": "b"},
    ]
    assert list(out[0]) == ["op", "id", "v"]


def test_default_nested_output_writes_update_before_as_its_own_record() -> None:
    out = list(to_changelog([ub(id=1, v="a"), ua(id=1, v="b")], before="before", after="after"))
    assert out == [
        {"op": "UPDATE_BEFORE", "before": {"id": 1, "v": "a"}, "after": None},
        {"op": "UPDATE_AFTER", "before": None, "after": {"id": 1, "v": "b"}},
    ]


def test_explicit_mapping_drops_unmapped_kinds() -> None:
    out = list(to_changelog([ins(id=1), dele(id=1)], op_mapping={"INSERT": "c"}))
    assert out == [{"op": "c", "id": 1}]


def test_row_with_a_column_named_like_the_op_field_fails() -> None:
    with pytest.raises(ChangelogDataError, match="already has a column 'op'"):
        list(to_changelog([ins(op="x", id=1)]))


def test_partial_delete_with_null_key_fails() -> None:
    with pytest.raises(NullKeyError):
        list(to_changelog([dele(id=None, v=1)], partition_by="id"))


def test_combined_update_waits_for_its_update_after_per_key() -> None:
    changes = [ub(id=1, v="a"), ub(id=2, v="x"), ua(id=2, v="y"), ua(id=1, v="b")]
    out = list(to_changelog(changes, before="b", after="a", partition_by="id", op_mapping=DEBEZIUM))
    assert out == [
        {"op": "u", "b": {"id": 2, "v": "x"}, "a": {"id": 2, "v": "y"}},
        {"op": "u", "b": {"id": 1, "v": "a"}, "a": {"id": 1, "v": "b"}},
    ]


def test_orphaned_update_before_is_written_not_lost() -> None:
    out = list(
        to_changelog(
            [ub(id=1, v="a"), dele(id=1, v="a"), ub(id=2, v="z")],
            before="b",
            after="a",
            partition_by="id",
            produces_full_deletes=True,
            op_mapping=DEBEZIUM,
        )
    )
    assert out == [
        {"op": "u", "b": {"id": 1, "v": "a"}, "a": None},
        {"op": "d", "b": {"id": 1, "v": "a"}, "a": None},
        {"op": "u", "b": {"id": 2, "v": "z"}, "a": None},  # written at the end of the input
    ]


def test_update_after_without_before_is_written_as_insert() -> None:
    out = list(to_changelog([ua(id=1, v="b")], before="b", after="a", op_mapping=DEBEZIUM))
    assert out == [{"op": "c", "b": None, "a": {"id": 1, "v": "b"}}]


def test_expired_pending_update_before_is_dropped_and_update_becomes_insert() -> None:
    clock = FakeClock(0)
    metrics = ChangelogMetrics()
    conversion = ToChangelog(
        plan_to_changelog(before="b", after="a", op_mapping=DEBEZIUM, state_ttl=timedelta(minutes=5)),
        clock=clock,
        metrics=metrics,
    )
    assert conversion.process(ub(id=1, v="a")) == []
    clock.now = 5 * 60
    assert conversion.process(ua(id=1, v="b")) == [{"op": "c", "b": None, "a": {"id": 1, "v": "b"}}]
    assert conversion.flush() == []


def test_upsert_input_gets_before_image_from_state_and_full_deletes_from_state() -> None:
    changes = [ins(id=1, v="a"), ua(id=1, v="b"), dele(id=1)]
    out = list(
        to_changelog(
            changes,
            before="b",
            after="a",
            partition_by="id",
            state_ttl=0,
            produces_full_deletes=True,
            op_mapping={"INSERT": "c", "UPDATE_AFTER": "u", "DELETE": "d"},
        )
    )
    assert out == [
        {"op": "c", "b": None, "a": {"id": 1, "v": "a"}},
        {"op": "u", "b": {"id": 1, "v": "a"}, "a": {"id": 1, "v": "b"}},
        {"op": "d", "b": {"id": 1, "v": "b"}, "a": None},
    ]


def test_single_payload_field_holds_the_row() -> None:
    out = list(to_changelog([ins(id=1), dele(id=1)], before="payload", after="payload"))
    assert out == [{"op": "INSERT", "payload": {"id": 1}}, {"op": "DELETE", "payload": {"id": 1}}]


def test_passthrough_stays_top_level_and_leaves_the_images() -> None:
    out = list(
        to_changelog(
            [ub(id=1, ts=1), ua(id=1, ts=2)], before="b", after="a", passthrough="ts", op_mapping=DEBEZIUM
        )
    )
    assert out == [{"op": "u", "ts": 2, "b": {"id": 1}, "a": {"id": 1}}]
    assert list(out[0]) == ["op", "ts", "b", "a"]


def test_passthrough_missing_from_row_fails() -> None:
    with pytest.raises(ChangelogDataError, match="passthrough field 'ts' is not a column"):
        list(to_changelog([ins(id=1)], after="a", passthrough="ts"))


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"passthrough": "op"}, "the output's op field"),
        ({"after": "a", "passthrough": "a"}, "must not name before or after"),
        ({"op_mapping": {"INSERT": "x", "DELETE": "x"}}, "writes the code 'x'"),
    ],
)
def test_parameter_errors(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ChangelogValidationError, match=message):
        to_changelog([], **params)


def test_on_time_buffers_until_the_watermark_and_hides_the_time_column() -> None:
    items: list[Any] = [ins(id=1, t=5), ins(id=2, t=3), Watermark(4), ins(id=3, t=1), Watermark(9)]
    conversion = ToChangelog(plan_to_changelog(on_time="t"))
    out = [
        conversion.process(i) if not isinstance(i, Watermark) else conversion.on_watermark(i) for i in items
    ]
    assert out == [
        [],
        [],
        [{"op": "INSERT", "id": 2}],
        [{"op": "INSERT", "id": 3}],  # at or below the watermark: nothing to wait for
        [{"op": "INSERT", "id": 1}],
    ]


def test_on_time_null_fails() -> None:
    with pytest.raises(ChangelogDataError, match="field 't': the event time is NULL"):
        list(to_changelog([ins(id=1, t=None)], on_time="t"))
