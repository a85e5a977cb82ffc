"""restart_by: a log position that restarts (failover, RESET MASTER) is told from a late change by the
commit timestamp, across batches, within one batch and across a restart of the applier."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from cdcflow.connectors.errors import ConnectorOptionError
from cdcflow.connectors.lakehouse.delta.apply import DeltaChangeApplier
from cdcflow.connectors.lakehouse.delta.key_state import STATE_RESTART
from cdcflow.connectors.lakehouse.delta.options import ApplyOptions, Materialize
from cdcflow.connectors.lakehouse.delta.result import BatchApplied

ROW_KIND = "_row_kind"
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("name", pa.string()),
        ("source_sequence", pa.list_(pa.int64())),
        ("source_timestamp", pa.timestamp("ms", tz="UTC")),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        (ROW_KIND, pa.string()),
    ]
)
T0 = dt.datetime(2024, 5, 1, 12, 0, 0, tzinfo=dt.UTC)
MODES = {"sequence_by": Materialize.NONE, "materialize": Materialize.FORCE}


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def change(kind: str, key: int, name: str | None, sequence: list[int], seconds: float) -> dict[str, Any]:
    return {
        "id": key,
        "name": name,
        "source_sequence": sequence,
        "source_timestamp": at(seconds),
        ROW_KIND: kind,
    }


def batch(*changes: dict[str, Any]) -> pa.Table:
    rows = [{**c, "topic": "db.t", "partition": 0, "offset": 100 + n} for n, c in enumerate(changes)]
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def applier(
    tmp_path: Path, mode: str = "sequence_by", restart_by: str | None = "source_timestamp"
) -> DeltaChangeApplier:
    """A new applier each time: every batch reads the key state back from its Delta table."""
    options = ApplyOptions(
        key=("id",),
        sequence_by="source_sequence",
        restart_by=restart_by,
        materialize=MODES[mode],
        upsert_key=("id",),
        exclude=("source_sequence", "source_timestamp", "topic", "partition", "offset"),
    )
    return DeltaChangeApplier(
        str(tmp_path / "table"), options, app_id="app", state_path=str(tmp_path / "state")
    )


def table(tmp_path: Path) -> dict[int, str | None]:
    rows = DeltaTable(str(tmp_path / "table")).to_pyarrow_table().to_pylist()
    return {row["id"]: row["name"] for row in rows}


def update(key: int, old: str, new: str, sequence: list[int], seconds: float) -> list[dict[str, Any]]:
    return [change("-U", key, old, sequence, seconds), change("+U", key, new, sequence, seconds)]


@pytest.mark.parametrize("mode", MODES)
def test_a_restarted_position_across_batches_is_applied_late_changes_are_still_ignored(
    tmp_path: Path, mode: str
) -> None:
    applier(tmp_path, mode).apply(
        batch(change("+I", 1, "old", [42, 9000, 0], 0), change("+I", 2, "other", [42, 9001, 0], 0)), 0
    )

    # RESET MASTER: binlog 1 after binlog 42, committed a second later
    restarted = applier(tmp_path, mode).apply(batch(*update(1, "old", "new", [1, 4000, 0], 1)), 1)
    assert table(tmp_path) == {1: "new", 2: "other"}
    assert (restarted.restarts, restarted.late, restarted.upserts) == (1, 0, 1)

    # older position AND older commit time than the key's last change: genuinely late
    late = applier(tmp_path, mode).apply(batch(*update(1, "new", "stale", [1, 3000, 0], 0.5)), 2)
    assert table(tmp_path) == {1: "new", 2: "other"}
    assert (late.restarts, late.upserts) == (0, 0) and late.late >= 1

    # the key's state holds the new position: the next change is an ordinary one, not another restart
    after = applier(tmp_path, mode).apply(batch(*update(1, "new", "newer", [1, 5000, 0], 2)), 3)
    assert table(tmp_path) == {1: "newer", 2: "other"}
    assert (after.restarts, after.late) == (0, 0)


@pytest.mark.parametrize("mode", MODES)
def test_a_restart_within_one_batch_orders_the_key_by_arrival(tmp_path: Path, mode: str) -> None:
    unrelated = [change("+I", n, f"row {n}", [42, 100 + n, 0], 0) for n in range(10, 40)]
    applied = applier(tmp_path, mode).apply(
        batch(
            change("+I", 1, "old", [42, 9000, 0], 0),
            *unrelated[:15],
            *update(1, "old", "new", [1, 4000, 0], 1),
            *unrelated[15:],
            change("+I", 2, "kept", [42, 9500, 0], 0),
            *update(2, "kept", "stale", [42, 9400, 0], 0),  # older position, same commit time: late
        ),
        0,
    )

    assert table(tmp_path) == {1: "new", 2: "kept", **{n: f"row {n}" for n in range(10, 40)}}
    assert applied.restarts == 1


def test_without_restart_by_a_lower_position_is_late(tmp_path: Path) -> None:
    """The old rule, and the defect when the source's position restarts: the newer value is dropped."""
    applier(tmp_path, restart_by=None).apply(batch(change("+I", 1, "old", [42, 9000, 0], 0)), 0)

    applied = applier(tmp_path, restart_by=None).apply(batch(*update(1, "old", "new", [1, 4000, 0], 1)), 1)

    assert table(tmp_path) == {1: "old"}
    assert applied.late > 0 and applied.restarts == 0


@pytest.mark.parametrize("mode", MODES)
def test_key_state_written_without_restart_by_gains_the_column(tmp_path: Path, mode: str) -> None:
    """State tables written before restart_by existed (the same layout as without it) keep working: the
    column is added on first use; until a key's timestamp is known, its lower positions stay late."""
    applier(tmp_path, mode, restart_by=None).apply(
        batch(change("+I", 1, "old", [42, 9000, 0], 0), change("+I", 2, "two", [42, 9001, 0], 0)), 0
    )
    assert STATE_RESTART not in DeltaTable(str(tmp_path / "state")).schema().to_arrow().names

    first: BatchApplied = applier(tmp_path, mode).apply(
        batch(*update(1, "old", "unknown", [1, 4000, 0], 1), *update(2, "two", "two b", [42, 9100, 0], 1)), 1
    )
    assert STATE_RESTART in DeltaTable(str(tmp_path / "state")).schema().to_arrow().names
    assert table(tmp_path) == {1: "old", 2: "two b"}
    assert (first.late >= 1, first.restarts) == (True, 0)

    second = applier(tmp_path, mode).apply(batch(*update(2, "two b", "two c", [1, 10, 0], 2)), 2)
    assert table(tmp_path) == {1: "old", 2: "two c"}
    assert second.restarts == 1


def test_restart_by_needs_a_sequence() -> None:
    with pytest.raises(ConnectorOptionError, match="restart_by .* with sequence_by"):
        ApplyOptions(key=("id",), restart_by="source_timestamp")
