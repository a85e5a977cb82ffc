"""The sink's per-key state, kept in a Delta table of its own next to the query's checkpoint.

Rows: the key columns, ``_cdcflow_slot`` (0, 1, ... for the live rows of the upsert materializer,
-1 for a key's sequence/tombstone record), ``_cdcflow_seq`` (the last applied sequence, sortable
bytes), ``_cdcflow_state_restart`` (that change's ``restart_by`` value, sortable bytes; added to
state tables written before it existed when ``restart_by`` is first used), ``_cdcflow_deleted_at``
(when the key was deleted: a tombstone kept for the delete retention), ``_cdcflow_updated_at``, and
under materialization the row's other columns. Slots below -1 belong to primary-key changes, with
columns of their own added when first written (see :mod:`.fill`): ``_cdcflow_pending`` (JSON list of
column names) is what a claim or carry still waits for from an old key's delete.
Each batch rewrites the rows of the keys it touched in ONE merge whose commit records the batch id,
like the target table's, so a replayed batch updates it at most once.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.connectors.lakehouse.delta.merge import OP, Before, Clause, Merge, NotEqual
from cdcflow.connectors.lakehouse.delta.tables import TableBackend, TableHandle, to_delta_columns

SLOT, STATE_SEQ, STATE_RESTART, DELETED_AT, UPDATED_AT = (
    "_cdcflow_slot",
    "_cdcflow_state_seq",
    "_cdcflow_state_restart",
    "_cdcflow_deleted_at",
    "_cdcflow_updated_at",
)
PENDING = "_cdcflow_pending"
TIMESTAMP = pa.timestamp("us", tz="UTC")


def load(
    table: TableHandle | None,
    key: Sequence[str],
    keys: pa.Table,
    now: datetime,
    retention: timedelta,
    ttl: timedelta | None,
) -> pa.Table | None:
    """The live state rows of ``keys`` (expired tombstones and entries past the TTL left out)."""
    if table is None:
        return None
    rows = table.rows_of_keys(key, keys)
    if STATE_RESTART not in rows.schema.names:
        rows = rows.append_column(STATE_RESTART, pa.nulls(rows.num_rows, pa.large_binary()))
    if PENDING not in rows.schema.names:
        rows = rows.append_column(PENDING, pa.nulls(rows.num_rows, pa.string()))
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
    backend: TableBackend,
    path: str,
    table: TableHandle | None,
    rows: pa.Table,
    key: Sequence[str],
    app_id: str,
    batch_id: int,
    now: datetime,
    retention: timedelta,
    ttl: timedelta | None,
    *,
    truncated: bool = False,
) -> None:
    """Upsert ``rows`` (with ``_cdcflow_op`` D marking slots to remove) and drop expired entries.

    After a truncate every slot but the keys' sequences (-1) goes too, unless ``rows`` rewrites it.
    """
    data = to_delta_columns(rows.drop_columns([OP])).append_column(OP, rows.column(OP))
    if table is None:
        table = backend.create(path, data.drop_columns([OP]).schema, [*key, SLOT])
    expired: list[Clause] = [Before(DELETED_AT, now - retention)]
    if ttl is not None:
        expired.append(Before(UPDATED_AT, now - ttl))
    if truncated:
        expired.append(NotEqual(SLOT, -1))
    table.merge(Merge(data, [*key, SLOT], app_id, batch_id, delete_unmatched=expired))


def no_rows(key_fields: Sequence[pa.Field]) -> pa.Table:
    """An empty update (a truncate's batch rewrites the state even when it changed no key)."""
    fields = [
        *key_fields,
        pa.field(SLOT, pa.int32()),
        pa.field(STATE_SEQ, pa.large_binary()),
        pa.field(DELETED_AT, TIMESTAMP),
        pa.field(UPDATED_AT, TIMESTAMP),
        pa.field(OP, pa.string()),
    ]
    return pa.schema(fields).empty_table()


def set_property(
    backend: TableBackend,
    path: str,
    table: TableHandle | None,
    key_fields: Sequence[pa.Field],
    name: str,
    value: str,
) -> TableHandle:
    """Records ``name = value`` in the state table's properties (creating the table if needed)."""
    if table is None:
        empty = to_delta_columns(no_rows(key_fields).drop_columns([OP]))
        table = backend.create(path, empty.schema, [*(f.name for f in key_fields), SLOT])
    table.set_properties({name: value})
    return table


def stamp(now: datetime) -> pa.Scalar:
    return pa.scalar(now, TIMESTAMP)


def utc_now(clock: float) -> datetime:
    return datetime.fromtimestamp(clock, UTC)
