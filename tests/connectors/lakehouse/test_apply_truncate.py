"""TRUNCATE and other control events in a changelog: applied once, in the batch's single commit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from test_apply import KEY, ROW_KIND, rows, txn_versions

from cdcflow.connectors.errors import ChangelogConsistencyError, ConnectorOptionError
from cdcflow.connectors.lakehouse.delta.apply import DeltaChangeApplier
from cdcflow.connectors.lakehouse.delta.batch import OnTruncate
from cdcflow.connectors.lakehouse.delta.options import ApplyOptions, Materialize

CONTROL = "_control"
SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("id", pa.int64()),
        ("name", pa.string()),
        ("seq", pa.int64()),
        (ROW_KIND, pa.string()),
        (CONTROL, pa.string()),
    ]
)
COORDINATES = ("topic", "partition", "offset", "seq")


def table(*changes: tuple[str, dict[str, Any]]) -> pa.Table:
    out = []
    for offset, (kind, row) in enumerate(changes):
        coordinates = {"topic": "t", "partition": 0, "offset": 100 + offset}
        if kind in ("truncate", "message"):
            out.append({**coordinates, **row, CONTROL: kind})
        else:
            out.append({**coordinates, **row, ROW_KIND: kind})
    return pa.Table.from_pylist(out, schema=SCHEMA)


def applier(tmp_path: Path, **options: Any) -> DeltaChangeApplier:
    opts = ApplyOptions(
        key=KEY, **{"upsert_key": KEY, "exclude": COORDINATES, "control_column": CONTROL, **options}
    )
    state = str(tmp_path / "state") if opts.stateful else None
    return DeltaChangeApplier(str(tmp_path / "table"), opts, app_id="app", state_path=state)


MODES = {
    "arrival order": {},
    "sequence_by": {"sequence_by": "seq"},
    "materialize": {"materialize": Materialize.FORCE},
}
TRUNCATE: tuple[str, dict[str, Any]] = ("truncate", {})


@pytest.mark.parametrize("mode", MODES)
def test_a_truncate_voids_the_batchs_earlier_changes_and_empties_the_table(tmp_path: Path, mode: str) -> None:
    sink = applier(tmp_path, **MODES[mode])
    sink.apply(table(("+I", {"id": 1, "name": "a", "seq": 1}), ("+I", {"id": 2, "name": "b", "seq": 2})), 0)
    version = DeltaTable(str(tmp_path / "table")).version()

    applied = sink.apply(
        table(
            ("+I", {"id": 3, "name": "c", "seq": 3}),
            ("truncate", {"seq": 4}),
            ("+I", {"id": 4, "name": "d", "seq": 5}),
            ("+I", {"id": 2, "name": "b2", "seq": 6}),
        ),
        1,
    )

    assert rows(tmp_path / "table") == [{"id": 2, "name": "b2"}, {"id": 4, "name": "d"}]
    assert applied.truncates == 1 and applied.changes == 3
    assert DeltaTable(str(tmp_path / "table")).version() == version + 1, "one commit for the batch"
    assert txn_versions(tmp_path / "table", "app") == [0, 1]


@pytest.mark.parametrize("mode", MODES)
def test_a_truncate_is_applied_once_across_replays_and_restarts(tmp_path: Path, mode: str) -> None:
    applier(tmp_path, **MODES[mode]).apply(table(("+I", {"id": 1, "name": "a", "seq": 1})), 0)
    truncate = table(("truncate", {"seq": 2}))
    applier(tmp_path, **MODES[mode]).apply(truncate, 1)
    applier(tmp_path, **MODES[mode]).apply(table(("+I", {"id": 2, "name": "b", "seq": 3})), 2)

    replay = applier(tmp_path, **MODES[mode]).apply(truncate, 1)

    assert replay.skipped or replay.table_version is None
    assert rows(tmp_path / "table") == [{"id": 2, "name": "b"}]


def test_a_truncate_clears_the_materialized_rows(tmp_path: Path) -> None:
    """Otherwise the pre-truncate row is still live in the state and comes back on a later delete."""
    sink = applier(tmp_path, materialize=Materialize.FORCE, upsert_key=None)
    sink.apply(table(("+I", {"id": 1, "name": "a"})), 0)
    sink.apply(table(TRUNCATE), 1)
    sink.apply(table(("+I", {"id": 1, "name": "b"})), 2)

    sink.apply(table(("-D", {"id": 1, "name": "b"})), 3)

    assert rows(tmp_path / "table") == []


def test_a_truncate_orders_by_sequence_within_the_batch(tmp_path: Path) -> None:
    sink = applier(tmp_path, sequence_by="seq")
    sink.apply(table(("+I", {"id": 1, "name": "a", "seq": 1})), 0)

    sink.apply(
        table(
            ("truncate", {"seq": 5}),
            ("+I", {"id": 2, "name": "before", "seq": 3}),  # arrives after, happened before: void
            ("+I", {"id": 3, "name": "after", "seq": 7}),
        ),
        1,
    )

    assert rows(tmp_path / "table") == [{"id": 3, "name": "after"}]


def test_an_ignored_truncate_is_counted_and_leaves_the_rows(tmp_path: Path) -> None:
    sink = applier(tmp_path, on_truncate=OnTruncate.IGNORE)
    sink.apply(table(("+I", {"id": 1, "name": "a"})), 0)

    applied = sink.apply(table(TRUNCATE, ("+I", {"id": 2, "name": "b"})), 1)

    assert rows(tmp_path / "table") == [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]
    assert applied.truncates == 1


def test_a_refused_truncate_names_where_it_came_from_and_the_option(tmp_path: Path) -> None:
    sink = applier(tmp_path, on_truncate=OnTruncate.FAIL)
    sink.apply(table(("+I", {"id": 1, "name": "a"})), 0)

    with pytest.raises(ChangelogConsistencyError, match=r"^t/0@101: .*on_truncate='fail'.*'apply'"):
        sink.apply(table(("+I", {"id": 2, "name": "b"}), TRUNCATE), 1)
    assert rows(tmp_path / "table") == [{"id": 1, "name": "a"}]


def test_other_control_events_are_counted_and_skipped(tmp_path: Path) -> None:
    sink = applier(tmp_path)

    applied = sink.apply(table(("message", {}), ("+I", {"id": 1, "name": "a"}), ("message", {})), 0)

    assert rows(tmp_path / "table") == [{"id": 1, "name": "a"}]
    assert (applied.control_events, applied.truncates, applied.changes) == (2, 0, 1)


def test_on_truncate_is_parsed_strictly() -> None:
    assert OnTruncate.parse(" Ignore ") is OnTruncate.IGNORE
    with pytest.raises(ConnectorOptionError, match="apply, ignore, fail"):
        OnTruncate.parse("skip")


def test_under_sequence_by_a_truncate_orders_with_changes_of_other_batches(tmp_path: Path) -> None:
    """Input partitions reach a batch at different positions: a change from before a TRUNCATE can
    arrive in a later batch, and one from after it in an earlier batch. The sequence decides."""
    applier(tmp_path, sequence_by="seq").apply(table(("+I", {"id": 1, "name": "a", "seq": 1})), 0)
    # partition 1 is ahead: a change made after the truncate (seq 20) lands before it
    applier(tmp_path, sequence_by="seq").apply(table(("+I", {"id": 2, "name": "after", "seq": 20})), 1)

    truncated = applier(tmp_path, sequence_by="seq").apply(table(("truncate", {"seq": 10})), 2)
    # partition 2 is behind: changes made before the truncate (seq 5, 6) arrive after it
    late = applier(tmp_path, sequence_by="seq").apply(
        table(("+I", {"id": 3, "name": "before", "seq": 5}), ("+U", {"id": 1, "name": "a2", "seq": 6})), 3
    )

    assert rows(tmp_path / "table") == [{"id": 2, "name": "after"}]
    assert truncated.truncates == 1
    assert late.late == 2 and late.upserts == 0
