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
from deltalake import DeltaTable

from cdcflow.connectors.lakehouse.delta_io import OP, merge_marked, quote, rows_of_keys
from cdcflow.connectors.lakehouse.delta_schema import create_table, to_delta_columns

SLOT, STATE_SEQ, DELETED_AT, UPDATED_AT = (
    "_cdcflow_slot",
    "_cdcflow_state_seq",
    "_cdcflow_deleted_at",
    "_cdcflow_updated_at",
)
TIMESTAMP = pa.timestamp("us", tz="UTC")


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
    rows = rows_of_keys(table, path, key, keys)
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
    data = to_delta_columns(rows.drop_columns([OP])).append_column(OP, rows.column(OP))
    if table is None:
        table = create_table(path, data.drop_columns([OP]).schema, [*key, SLOT])
    expired = f"t.{quote(DELETED_AT)} < '{_iso(now - retention)}'"
    if ttl is not None:
        expired += f" OR t.{quote(UPDATED_AT)} < '{_iso(now - ttl)}'"
    merge_marked(table, path, data, [*key, SLOT], app_id, batch_id, delete_unmatched=expired)


def stamp(now: datetime) -> pa.Scalar:
    return pa.scalar(now, TIMESTAMP)


def utc_now(clock: float) -> datetime:
    return datetime.fromtimestamp(clock, UTC)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
