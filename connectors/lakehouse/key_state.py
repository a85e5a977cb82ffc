"""The sink's per-key state, kept in a Delta table of its own next to the query's checkpoint.

Rows: the key columns, ``_cdcflow_slot`` (0, 1, ... for the live rows of the upsert materializer,
-1 for a key's sequence/tombstone record), ``_cdcflow_seq`` (the last applied sequence, sortable
bytes), ``_cdcflow_deleted_at`` (when the key was deleted: a tombstone kept for the delete
retention), ``_cdcflow_updated_at``, and under materialization the row's other columns.
Each batch rewrites the rows of the keys it touched in ONE merge whose commit records the batch id,
like the target table's, so a replayed batch updates it at most once.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction

from cdcflow.connectors.lakehouse.changes import OP
from cdcflow.connectors.lakehouse.delta_schema import (
    conform,
    create_table,
    local_filesystem,
    quote,
    to_delta_columns,
)

SLOT, STATE_SEQ, DELETED_AT, UPDATED_AT = (
    "_cdcflow_slot",
    "_cdcflow_state_seq",
    "_cdcflow_deleted_at",
    "_cdcflow_updated_at",
)
META = (SLOT, STATE_SEQ, DELETED_AT, UPDATED_AT)
TIMESTAMP = pa.timestamp("us", tz="UTC")


def open_table(path: str) -> DeltaTable | None:
    return DeltaTable(path) if DeltaTable.is_deltatable(path) else None


def applied_version(table: DeltaTable | None, app_id: str) -> int:
    if table is None:
        return -1
    version = table.transaction_version(app_id)
    return -1 if version is None else int(version)


def load(
    path: str,
    table: DeltaTable | None,
    key: Sequence[str],
    keys: pa.Table,
    now: datetime,
    retention: timedelta,
    ttl: timedelta | None,
) -> pa.Table | None:
    """The live state rows of ``keys`` (expired tombstones and entries past the TTL left out)."""
    if table is None:
        return None
    dataset = table.to_pyarrow_dataset(filesystem=local_filesystem(path))
    if len(key) == 1:
        kind = pa.schema(table.schema().to_arrow()).field(key[0]).type
        wanted = pc.unique(keys.column(key[0])).cast(kind)
        # delta-rs merges write strings as string_view: cast before comparing with the batch's keys.
        rows = dataset.to_table(filter=pc.field(key[0]).cast(kind).isin(wanted))
    else:
        rows = dataset.to_table()
        # Join on the keys alone (Arrow joins refuse nested payload columns), then take the rows.
        probe = rows.select(list(key)).append_column(
            "_cdcflow_pos", pa.array(range(rows.num_rows), pa.int64())
        )
        wanted = keys.select(list(key)).group_by(list(key)).aggregate([])
        hits = probe.join(wanted, list(key), join_type="inner", use_threads=False)
        rows = rows.take(hits.column("_cdcflow_pos"))
    return rows.filter(_alive(rows, now, retention, ttl))


def _alive(rows: pa.Table, now: datetime, retention: timedelta, ttl: timedelta | None) -> pa.Array:
    deleted = rows.column(DELETED_AT)
    alive = pc.or_kleene(
        pc.is_null(deleted), pc.greater_equal(deleted, pa.scalar(now - retention, TIMESTAMP))
    )
    if ttl is not None:
        alive = pc.and_kleene(
            alive, pc.greater_equal(rows.column(UPDATED_AT), pa.scalar(now - ttl, TIMESTAMP))
        )
    return alive


def save(
    path: str,
    table: DeltaTable | None,
    rows: pa.Table,
    key: Sequence[str],
    app_id: str,
    batch_id: int,
    now: datetime,
    retention: timedelta,
    ttl: timedelta | None,
) -> None:
    """Upsert ``rows`` (with ``_cdcflow_op`` D marking slots to remove) and drop expired entries."""
    data = to_delta_columns(rows.drop_columns([OP]))
    if table is None:
        table = create_table(path, data.schema, [*key, SLOT])
    source = conform(table, data, [*key, SLOT], path).append_column(OP, rows.column(OP))
    columns = [n for n in source.schema.names if n != OP]
    on = " AND ".join(f"t.{quote(c)} = s.{quote(c)}" for c in (*key, SLOT))
    assignments = {quote(c): f"s.{quote(c)}" for c in columns}
    expired = f"t.{quote(DELETED_AT)} < '{_iso(now - retention)}'"
    if ttl is not None:
        expired += f" OR t.{quote(UPDATED_AT)} < '{_iso(now - ttl)}'"
    (
        table.merge(
            source,
            predicate=on,
            source_alias="s",
            target_alias="t",
            commit_properties=CommitProperties(app_transactions=[Transaction(app_id, batch_id)]),
        )
        .when_matched_delete(predicate=f"s.{OP} = 'D'")
        .when_matched_update(updates=assignments, predicate=f"s.{OP} = 'U'")
        .when_not_matched_insert(updates=assignments, predicate=f"s.{OP} = 'U'")
        .when_not_matched_by_source_delete(predicate=expired)
        .execute()
    )


def stamp(now: datetime) -> pa.Scalar:
    return pa.scalar(now, TIMESTAMP)


def utc_now(clock: float) -> datetime:
    return datetime.fromtimestamp(clock, UTC)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
