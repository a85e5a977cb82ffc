"""Every example of the FROM_CHANGELOG / TO_CHANGELOG spec (sections 4.1, 4.2, 4.3, 4.5) as a test.

Expected outputs are copied from the spec (../shared/spec/000_*.txt); where the spec contradicts itself or
leaves a choice open we follow docs/spec-notes.md and cite the note ("note N"). Rows are compared with
their column order, since the spec shows Flink rows (`+I[id: 5, name: 'name']`), whose order matters.

Inputs are fed one item at a time (`run_steps`), so a test can say what the engine emitted while it
handled each record or watermark, and move the fake wall clock between records (state TTL is
processing time).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, time, timedelta, timezone
from typing import Any

import pytest

from cdcflow import Change, RowKind, Watermark, from_changelog, to_changelog
from cdcflow.core import (
    CdcflowError,
    ChangelogDataError,
    ChangelogMetrics,
    ChangelogValidationError,
    InMemoryStateStore,
    InvalidOperationError,
    NullKeyError,
    NullOperationError,
    OpMappingError,
    plan_from_changelog,
)

Row = dict[str, Any]
INSERT, UPDATE_BEFORE, UPDATE_AFTER, DELETE = (
    RowKind.INSERT,
    RowKind.UPDATE_BEFORE,
    RowKind.UPDATE_AFTER,
    RowKind.DELETE,
)
UPSERT_KINDS = {INSERT, UPDATE_AFTER, DELETE}
RETRACT_KINDS = set(RowKind)


# ----------------------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------------------


def ins(**row: Any) -> Change:
    """``+I[...]``"""
    return Change(INSERT, dict(row))


def ub(**row: Any) -> Change:
    """``-U[...]``"""
    return Change(UPDATE_BEFORE, dict(row))


def ua(**row: Any) -> Change:
    """``+U[...]``"""
    return Change(UPDATE_AFTER, dict(row))


def dl(**row: Any) -> Change:
    """``-D[...]``"""
    return Change(DELETE, dict(row))


def t(hhmm: str) -> time:
    """An event time as the spec writes it: ``'10:05'``."""
    hours, minutes = hhmm.split(":")
    return time(int(hours), int(minutes))


def wm(hhmm: str) -> Watermark:
    """``Current Watermark: 10:00``."""
    return Watermark(t(hhmm))


def wall(hhmm: str) -> float:
    """``Wall Clock: 14:00`` as epoch seconds (on an arbitrary fixed day)."""
    return datetime.combine(datetime(2024, 1, 1).date(), t(hhmm), tzinfo=timezone.utc).timestamp()


@dataclass
class FakeClock:
    """A processing-time clock the test moves by hand."""

    now: float = field(default_factory=lambda: wall("12:00"))

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class At:
    """An input item that arrives when the wall clock reads ``clock`` (``'14:03'``)."""

    clock: str
    item: Any


def run_steps(
    convert: Callable[..., Iterator[Any]],
    steps: Sequence[Any],
    *,
    probe: Callable[[], Any] | None = None,
    **kwargs: Any,
) -> tuple[list[list[Any]], list[Any]]:
    """Feed ``steps`` one by one to ``convert`` (from_changelog / to_changelog).

    Returns ``(emitted, probes)``: ``emitted[i]`` is what the engine produced while handling ``steps[i]``
    (it is handling step i until it asks for step i+1), and ``emitted[-1]`` what it produced at the end of
    the input. ``probes[i]`` is ``probe()`` called once step i is handled. A step is an input item, or
    ``At(clock, item)`` to set the fake clock (``kwargs['clock']``) first.
    """
    emitted: list[list[Any]] = [[] for _ in range(len(steps) + 1)]
    probes: list[Any] = []
    position = -1
    clock = kwargs.get("clock")

    def source() -> Iterator[Any]:
        nonlocal position
        for index, step in enumerate(steps):
            if index and probe is not None:
                probes.append(probe())
            if isinstance(step, At):
                assert isinstance(clock, FakeClock), "At(...) steps need clock=FakeClock()"
                clock.now = wall(step.clock)
                step = step.item
            position = index
            yield step
        if steps and probe is not None:
            probes.append(probe())
        position = len(steps)

    for out in convert(source(), **kwargs):
        emitted[position].append(out)
    return emitted, probes


class Tracked:
    """An input that remembers whether the engine pulled anything from it."""

    def __init__(self, items: Iterable[Any]) -> None:
        self.items = list(items)
        self.pulled = 0

    def __iter__(self) -> Iterator[Any]:
        for item in self.items:
            self.pulled += 1
            yield item


def ordered(value: Any) -> Any:
    """A value with the column order of every row made visible, for exact comparisons."""
    if isinstance(value, Change):
        return (value.kind.short_string, ordered(value.row))
    if isinstance(value, Mapping):
        return [(key, ordered(item)) for key, item in value.items()]
    if isinstance(value, list):
        return [ordered(item) for item in value]
    return value


def assert_exact(actual: Any, expected: Any) -> None:
    """Equal, row for row and column for column, in order."""
    assert ordered(actual) == ordered(expected)


def materialize(changes: Iterable[Change], initial: Iterable[Row] = (), key: str = "id") -> list[Row]:
    """The table a changelog turns ``initial`` into (the spec's "Table" lines).

    Every retraction (-U, -D) must remove exactly the row the table holds for its key.
    """
    table: dict[Any, Row] = {row[key]: row for row in initial}
    for change in changes:
        if change.kind in (INSERT, UPDATE_AFTER):
            table[change.row[key]] = change.row
        else:
            assert table.pop(change.row[key], None) == change.row, f"{change} retracts a row the table lacks"
    return list(table.values())


def stored_images(store: InMemoryStateStore) -> list[tuple[Row | None, float | None]]:
    """What the engine keeps per key: last image and expiry time (how it encodes the key is its business)."""
    return [(state.image, state.expires_at) for _, state in store.items() if not state.is_empty]


def flat(emitted: list[list[Any]]) -> list[Any]:
    return [out for step in emitted for out in step]


# ----------------------------------------------------------------------------------------------------------
# 4.1 FROM_CHANGELOG
# ----------------------------------------------------------------------------------------------------------


def test_4_1_1_default_signature() -> None:
    rows = [
        {"op": "INSERT", "id": 5, "name": "name"},
        {"op": "DELETE", "id": 5, "name": "name"},
    ]
    out = list(from_changelog(rows))
    assert_exact(out, [ins(id=5, name="name"), dl(id=5, name="name")])
    assert [str(change) for change in out] == ["+I[5, name]", "-D[5, name]"]
    assert materialize(out) == []  # Table: empty


def test_4_1_2_1_1_flat_records_with_custom_header() -> None:
    rows = [
        {"type": "INSERT", "id": 5, "name": "name"},
        {"type": "DELETE", "id": 5, "name": "name"},
    ]
    out = list(from_changelog(rows, op="type"))
    assert_exact(out, [ins(id=5, name="name"), dl(id=5, name="name")])
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
            [dl(id=99, name="Orphan Updated")],
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
    assert_exact(list(from_changelog([{"op": "d", "id": 5}], **kwargs)), [dl(id=5)])
    assert plan_from_changelog(**kwargs).output_mode.key_only_deletes is True


def test_4_1_2_3_2_consuming_full_deletes() -> None:
    kwargs: dict[str, Any] = {
        "partition_by": "id",
        "uid": "full-delete-example",
        "consume_full_deletes": True,
        "op_mapping": CDC_MAPPING,
    }
    out = list(from_changelog([{"op": "d", "id": 5, "name": "Alice", "age": 30}], **kwargs))
    assert_exact(out, [dl(id=5, name="Alice", age=30)])
    assert plan_from_changelog(**kwargs).output_mode.key_only_deletes is False


DEBEZIUM_MAPPING = {"c, r": "INSERT", "d": "DELETE", "u": "UPDATE_AFTER"}


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
            [dl(id=1, name="B", field1="f3", field2=3)],
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
    assert_exact(out, [ins(id=1, name="a"), ins(id=2, name="b"), ua(id=1, name="a2"), dl(id=2, name="b")])
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
    assert_exact(out, [ins(id=1, name="a"), ub(id=1, name="a"), ua(id=1, name="b"), dl(id=1, name="b")])
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
    assert_exact(out, [ins(id=1, name="a"), ua(id=1, name="b"), dl(id=1, name="b")])  # before image ignored
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
    assert_exact(out, [ins(id=1, name="a"), ua(id=1, name="b"), dl(id=1, name="b")])
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
    assert_exact(out, [dl(id=5)])
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
    assert_exact(out, [dl(id=5, name="Alice", age=30)])
    assert plan_from_changelog(**kwargs).output_mode.key_only_deletes is False
    assert len(store) == 0


DELETION_FLAG_ROWS = [
    {"deleted": "false", "id": 1, "name": "a"},
    {"deleted": "false", "id": 1, "name": "b"},
    {"deleted": "true", "id": 1, "name": "b"},
]


def _assert_needs_state(rows: list[Row], **kwargs: Any) -> None:
    """Without state_ttl the mapping is rejected at planning time, asking for state_ttl (note 1)."""
    source = Tracked(rows)
    with pytest.raises(ChangelogValidationError, match="state_ttl") as error:
        list(from_changelog(source, **kwargs))
    assert "partition_by" in str(error.value)
    assert source.pulled == 0


def test_4_1_3_7_upsert_stream_to_retract_stream_with_deletion_flag() -> None:
    store = InMemoryStateStore()
    kwargs: dict[str, Any] = {
        "partition_by": "id",
        "uid": "my-cdc-ptf",
        "op": "deleted",
        "op_mapping": {"false": "INSERT, UPDATE_BEFORE, UPDATE_AFTER", "true": "DELETE"},
    }
    emitted, states = run_steps(
        from_changelog,
        DELETION_FLAG_ROWS,
        probe=lambda: len(store),
        state_store=store,
        state_ttl=timedelta(minutes=10),
        clock=FakeClock(),
        **kwargs,
    )
    assert_exact(
        flat(emitted), [ins(id=1, name="a"), ub(id=1, name="a"), ua(id=1, name="b"), dl(id=1, name="b")]
    )
    assert states[:2] == [1, 1]  # the key's image is stored to produce the -U
    assert plan_from_changelog(state_ttl=timedelta(minutes=10), **kwargs).output_mode.kinds == RETRACT_KINDS
    _assert_needs_state(DELETION_FLAG_ROWS, **kwargs)


def test_4_1_3_8_upsert_stream_to_upsert_stream_with_deletion_flag() -> None:
    store = InMemoryStateStore()
    kwargs: dict[str, Any] = {
        "partition_by": "id",
        "uid": "my-cdc-ptf",
        "op": "deleted",
        "op_mapping": {"false": "INSERT, UPDATE_AFTER", "true": "DELETE"},
    }
    emitted, states = run_steps(
        from_changelog,
        DELETION_FLAG_ROWS,
        probe=lambda: len(store),
        state_store=store,
        state_ttl=timedelta(minutes=10),
        clock=FakeClock(),
        **kwargs,
    )
    assert_exact(flat(emitted), [ins(id=1, name="a"), ua(id=1, name="b"), dl(id=1, name="b")])
    assert states[:2] == [1, 1]  # the key is remembered to tell INSERT from UPDATE_AFTER
    assert plan_from_changelog(state_ttl=timedelta(minutes=10), **kwargs).output_mode.kinds == UPSERT_KINDS
    _assert_needs_state(DELETION_FLAG_ROWS, **kwargs)


def test_4_1_3_9_upsert_stream_to_retract_stream() -> None:
    store = InMemoryStateStore()
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
    emitted, states = run_steps(
        from_changelog,
        rows,
        probe=lambda: len(store),
        state_store=store,
        state_ttl=timedelta(minutes=10),
        clock=FakeClock(),
        **kwargs,
    )
    assert_exact(
        flat(emitted), [ins(id=1, name="a"), ub(id=1, name="a"), ua(id=1, name="b"), dl(id=1, name="b")]
    )
    assert states[:2] == [1, 1]
    assert plan_from_changelog(state_ttl=timedelta(minutes=10), **kwargs).output_mode.kinds == RETRACT_KINDS
    _assert_needs_state(rows, **kwargs)


def test_4_1_3_10_upsert_stream_to_retract_stream_with_before_after() -> None:
    store = InMemoryStateStore()
    kwargs: dict[str, Any] = {
        "partition_by": "id",
        "uid": "my-cdc-ptf",
        "before": "before",
        "after": "after",
        "op_mapping": {"c, r": "INSERT", "d": "DELETE", "u": "UPDATE_BEFORE, UPDATE_AFTER"},
    }
    emitted, states = run_steps(
        from_changelog,
        AFTER_ONLY_ROWS,
        probe=lambda: len(store),
        state_store=store,
        state_ttl=timedelta(minutes=10),
        clock=FakeClock(),
        **kwargs,
    )
    # The -U comes from the stored image, since the update's before is null (note 2).
    assert_exact(
        flat(emitted), [ins(id=1, name="a"), ub(id=1, name="a"), ua(id=1, name="b"), dl(id=1, name="b")]
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
    assert_exact(out, [ins(**alice, ts_ms=1), ua(**alicia, ts_ms=2), dl(**alicia, ts_ms=3)])
    assert len(store) == 0


# ----------------------------------------------------------------------------------------------------------
# 4.2 TO_CHANGELOG
# ----------------------------------------------------------------------------------------------------------


def test_4_2_1_1_default_signature() -> None:
    changes = [ins(id=5, name="name"), ua(id=5, name="updated_name"), dl(id=5, name="updated_name")]
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
        dl(id=5, name="updated_name"),
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
        to_changelog([dl(id=5, name="Alice", age=30)], partition_by="id", op_mapping=DYNAMIC_TABLE_MAPPING)
    )
    assert_exact(out, [{"op": "d", "id": 5}])


def test_4_2_1_4_2_producing_full_deletes() -> None:
    kwargs: dict[str, Any] = {
        "partition_by": "id",
        "produces_full_deletes": True,
        "op_mapping": DYNAMIC_TABLE_MAPPING,
    }
    out = list(to_changelog([dl(id=5, name="Alice", age=30)], **kwargs))
    assert_exact(out, [{"op": "d", "id": 5, "name": "Alice", "age": 30}])

    # Upsert input with a partial delete: the stored image stands in for ChangelogNormalize (note 5).
    out = list(
        to_changelog(
            [ins(id=5, name="Alice", age=30), dl(id=5)],
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
            dl(id=5, name="updated_name"),
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
    assert_exact(list(to_changelog([dl(id=5, name="A")], **kwargs)), [{"deleted": "true", "id": 5}])
    assert_exact(
        list(to_changelog([dl(id=5, name="A")], produces_full_deletes=True, **kwargs)),
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
        to_changelog([dl(id=5, name="Alice", age=30)], partition_by="id", op_mapping=DYNAMIC_TABLE_MAPPING)
    )
    assert_exact(out, [{"op": "d", "id": 5}])


def test_4_2_2_6_producing_full_deletes_for_cdc_sink() -> None:
    out = list(
        to_changelog(
            [dl(id=5, name="Alice", age=30)],
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
    assert_exact(out, [{"op": "c", "ts_ms": 1234, "before": None, "after": {"id": 1, "name": "Alice"}}])


# ----------------------------------------------------------------------------------------------------------
# 4.3 Error handling
# ----------------------------------------------------------------------------------------------------------

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
    assert "order_by" in inspect.signature(from_changelog).parameters
    assert "order_by" not in inspect.signature(to_changelog).parameters


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
        list(to_changelog([dl(user_id=None, name="x")], partition_by="user_id"))
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
            [ins(id=1), ua(id=1), dl(id=1)], op_mapping={"INSERT, UPDATE_AFTER": "upsert", "DELETE": "delete"}
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


# ----------------------------------------------------------------------------------------------------------
# 4.5 Symmetrical usage
# ----------------------------------------------------------------------------------------------------------

DYNAMIC_TABLE = [ins(id=1, name="Alice"), ua(id=1, name="Alice Updated"), dl(id=1, name="Alice Updated")]
APPEND_STREAM = [
    {"op": "INSERT", "id": 1, "name": "Alice"},
    {"op": "UPDATE_AFTER", "id": 1, "name": "Alice Updated"},
    {"op": "DELETE", "id": 1, "name": "Alice Updated"},
]


def test_4_5_1_from_changelog_of_to_changelog() -> None:
    append_stream = list(to_changelog(DYNAMIC_TABLE))
    assert_exact(append_stream, APPEND_STREAM)
    changelog = list(from_changelog(append_stream))
    assert_exact(changelog, DYNAMIC_TABLE)
    assert materialize(changelog) == []  # Table: empty after all operations
    assert_exact(list(from_changelog(to_changelog(DYNAMIC_TABLE))), DYNAMIC_TABLE)  # chained lazily


def test_4_5_2_to_changelog_of_from_changelog() -> None:
    changelog = list(from_changelog(APPEND_STREAM))
    assert_exact(changelog, DYNAMIC_TABLE)
    assert materialize(changelog) == []
    assert_exact(list(to_changelog(changelog)), APPEND_STREAM)
    assert_exact(list(to_changelog(from_changelog(APPEND_STREAM))), APPEND_STREAM)
