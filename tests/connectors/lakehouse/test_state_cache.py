"""The key state kept in memory between batches leaves the tables the key state read and merged in the
table leaves: batch by batch, for every stateful mode, across restarts and another writer's commits."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdcflow.connectors.lakehouse.delta.apply import DeltaChangeApplier
from cdcflow.connectors.lakehouse.delta.merge import OP, Merge
from cdcflow.connectors.lakehouse.delta.options import ApplyOptions, Materialize
from cdcflow.connectors.lakehouse.delta.state_cache import CachedState, StateCache
from cdcflow.connectors.lakehouse.delta.tables import DELTA_RS

ROW_KIND, CONTROL = "_row_kind", "_control"
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("name", pa.string()),
        ("seq", pa.int64()),
        (ROW_KIND, pa.string()),
        (CONTROL, pa.string()),
    ]
)
MODES: dict[str, dict[str, Any]] = {
    "sequence_by": {"sequence_by": "seq"},
    "sequence_by, short retention and TTL": {
        "sequence_by": "seq",
        "delete_retention": timedelta(seconds=30),
        "state_ttl": timedelta(seconds=50),
    },
    "materialize": {"materialize": Materialize.FORCE},
    "materialize by sequence": {"materialize": Materialize.FORCE, "sequence_by": "seq"},
}


@st.composite
def changes(draw: st.DrawFn) -> list[dict[str, Any]]:
    """One batch: inserts, update pairs and deletes of 6 ids with sequences out of order, at times a
    truncate."""
    out: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(0, 7))):
        key, seq, name = draw(st.integers(0, 5)), draw(st.integers(0, 40)), draw(st.sampled_from("abc"))
        kind = draw(st.sampled_from(["+I", "+I", "U", "-D", "truncate"]))
        if kind == "truncate":
            out.append({"seq": seq, CONTROL: "truncate"})
        elif kind == "U":
            out.append({"id": key, "name": "old", "seq": seq, ROW_KIND: "-U"})
            out.append({"id": key, "name": name, "seq": seq, ROW_KIND: "+U"})
        else:
            out.append({"id": key, "name": name, "seq": seq, ROW_KIND: kind})
    return out


def applier(path: Path, mode: str, clock: list[float], *, kept: bool) -> DeltaChangeApplier:
    options = ApplyOptions(key=("id",), upsert_key=("id",), control_column=CONTROL, **MODES[mode])
    sink = DeltaChangeApplier(
        str(path / "table"), options, app_id="app", state_path=str(path / "state"), clock=lambda: clock[0]
    )
    if not kept:
        sink._state = StateCache(limit=-1)  # noqa: SLF001 - the reference: every read and write in the table
    return sink


def contents(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    found = []
    for name, order in (("table", ("id",)), ("state", ("id", "_cdcflow_slot"))):
        table = path / name
        rows = DeltaTable(str(table)).to_pyarrow_table().to_pylist() if table.exists() else []
        found.append(sorted(rows, key=lambda row: tuple(repr(row[c]) for c in order)))
    return found[0], found[1]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    mode=st.sampled_from(sorted(MODES)),
    batches=st.lists(st.tuples(changes(), st.integers(0, 2), st.integers(0, 25)), min_size=1, max_size=7),
)
def test_the_key_state_in_memory_leaves_the_tables_the_key_state_in_the_table_leaves(
    tmp_path_factory: Any, mode: str, batches: list[tuple[list[dict[str, Any]], int, int]]
) -> None:
    """``writer``: 0 the same applier as the batch before, 1 a new one (a restart), 2 the other of two
    appliers taking turns on the same tables (each finds the state at a version it did not write)."""
    kept, reference = tmp_path_factory.mktemp("kept"), tmp_path_factory.mktemp("reference")
    clock = [1_800_000_000.0]
    writers = [applier(kept, mode, clock, kept=True), applier(kept, mode, clock, kept=True)]
    other = applier(reference, mode, clock, kept=False)
    turn = 0
    for batch_id, (rows, writer, seconds) in enumerate(batches):
        clock[0] += seconds
        if writer == 1:
            writers[turn] = applier(kept, mode, clock, kept=True)
        elif writer == 2:
            turn = 1 - turn
        table = pa.Table.from_pylist(rows, schema=SCHEMA)
        try:
            expected = dataclasses.replace(other.apply(table, batch_id), seconds=0.0)
        except Exception as error:  # noqa: BLE001 - the same refusal either way
            other = applier(reference, mode, clock, kept=False)
            try:
                writers[turn].apply(table, batch_id)
            except type(error) as same:
                assert str(same) == str(error)
            else:
                raise AssertionError(f"the reference refused batch {batch_id}: {error}") from None
            return
        got = dataclasses.replace(writers[turn].apply(table, batch_id), seconds=0.0)
        assert got == expected
        assert contents(kept) == contents(reference), f"batch {batch_id}"


def test_a_batch_reads_and_writes_the_key_state_in_memory(tmp_path: Path, monkeypatch: Any) -> None:
    """After the first batch the state table is neither read by key nor merged: its rows are the ones
    the applier wrote, and each batch writes them whole in one commit with its application transaction."""
    merges: list[int] = []
    monkeypatch.setattr(CachedState, "merge", _counting(CachedState.merge, merges))
    clock = [1_800_000_000.0]
    sink = applier(tmp_path, "sequence_by", clock, kept=True)
    for batch_id in range(3):
        rows = [{"id": k, "name": "x", "seq": batch_id * 10 + k, ROW_KIND: "+I"} for k in range(batch_id + 2)]
        sink.apply(pa.Table.from_pylist(rows, schema=SCHEMA), batch_id)
    assert merges == [1, 2]  # batch 0 created the state table
    state = DeltaTable(str(tmp_path / "state"))
    assert state.transaction_version("app") == 2
    assert sorted(r["id"] for r in state.to_pyarrow_table().to_pylist()) == [0, 1, 2, 3]
    # Written as delta-rs writes its own files: compressed, with statistics to prune by.
    for name in state.file_uris():
        column = pq.ParquetFile(name).metadata.row_group(0).column(0)
        assert column.compression == "SNAPPY"
        assert column.statistics is not None and column.statistics.has_min_max


def _counting(merge: Any, calls: list[int]) -> Any:
    def counted(self: CachedState, plan: Any) -> int:
        calls.append(plan.batch_id)
        return int(merge(self, plan))

    return counted


@pytest.mark.parametrize("ids", [[1, 1], [7, 7], [1, 7, 7]], ids=["matched", "unmatched", "both"])
def test_a_merge_whose_source_repeats_an_identity_is_delta_rs_merge(tmp_path: Path, ids: list[int]) -> None:
    """Rows in memory cannot say what delta-rs makes of a repeated identity: such a merge is delta-rs's,
    with the same outcome (rows or refusal) as on a table never kept in memory."""
    outcomes = []
    for name, cache in (("kept", StateCache()), ("reference", StateCache(limit=-1))):
        path = str(tmp_path / name)
        handle = DELTA_RS.create(path, pa.schema([("id", pa.int64()), ("v", pa.string())]), ["id"])
        write_deltalake(handle.table, pa.table({"id": [1, 2], "v": ["a", "b"]}), mode="append")
        state = cache.wrap(DELTA_RS.open(path))
        assert isinstance(state, CachedState) == (name == "kept")
        source = pa.table({"id": ids, "v": [f"new {i}" for i in range(len(ids))], OP: ["U"] * len(ids)})
        try:
            assert state is not None
            state.merge(Merge(source, ("id",), "app", 0))
        except Exception as error:  # noqa: BLE001 - the refusal is the outcome compared
            outcomes.append(type(error).__name__)
        else:
            outcomes.append(sorted(DeltaTable(path).to_pyarrow_table().to_pylist(), key=repr))
    assert outcomes[0] == outcomes[1]
