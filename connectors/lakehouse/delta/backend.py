"""The table I/O a Delta writer does, behind one seam, and its embedded back end (delta-rs).

The applier plans each batch on the driver in Arrow (ordering, late changes, unavailable values, key
state) and then reads and writes tables only through a :class:`TableBackend`: open or create a table,
read the rows of some keys, read its application transactions and properties, add columns, and merge
a marked source (``_cdcflow_op``) in one commit that records ``(app_id, batch_id)``. Two back ends
implement it: :class:`DeltaRsBackend` (delta-rs, in the driver; the default) and
:class:`~cdcflow.connectors.lakehouse.spark_backend.SparkDeltaBackend` (Delta Lake's jars, the merge
running on Spark's executors). Both write the same tables; either continues the other's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from cdcflow.connectors.lakehouse.delta import tables as delta_io
from cdcflow.connectors.lakehouse.delta.merge import Merge
from cdcflow.connectors.lakehouse.delta.schema import create_table, table_schema
from cdcflow.connectors.lakehouse.delta.storage import LOCAL, Storage


class TableHandle(Protocol):
    """One Delta table at one version, as a back end reads and writes it."""

    path: str

    def version(self) -> int: ...

    def applied_version(self, app_id: str) -> int:
        """The last batch id ``app_id`` committed (-1 when none)."""
        ...

    def before(self, app_id: str, batch_id: int) -> TableHandle | None:
        """The table before the commit that recorded ``batch_id`` (None: before the table existed)."""
        ...

    def schema(self) -> pa.Schema: ...

    def properties(self) -> Mapping[str, str]: ...

    def set_properties(self, values: Mapping[str, str]) -> None: ...

    def rows_of_keys(
        self, key: Sequence[str], keys: pa.Table, columns: Sequence[str] | None = None
    ) -> pa.Table:
        """The rows whose ``key`` equals a row of ``keys`` (the key and ``columns``, or all columns)."""
        ...

    def rows_where(self, equal: Mapping[str, int], null: Sequence[str]) -> pa.Table:
        """The rows whose ``equal`` columns hold the given values and whose ``null`` columns are NULL."""
        ...

    def merge(self, merge: Merge) -> int:
        """Runs ``merge`` in one commit; the new version."""
        ...


class TableBackend(Protocol):
    name: str

    def open(self, path: str) -> TableHandle | None: ...

    def create(self, path: str, schema: pa.Schema, key: Sequence[str]) -> TableHandle:
        """A new empty table with ``schema`` (``key`` columns NOT NULL); an existing one is kept."""
        ...


def applied(table: TableHandle | None, app_id: str) -> int:
    return -1 if table is None else table.applied_version(app_id)


@dataclass
class RsTable:
    """A table read and written with delta-rs."""

    path: str
    table: DeltaTable
    storage: Storage = field(default=LOCAL, repr=False)

    def version(self) -> int:
        return int(self.table.version())

    def applied_version(self, app_id: str) -> int:
        return delta_io.applied_version(self.table, app_id)

    def before(self, app_id: str, batch_id: int) -> RsTable | None:
        table = delta_io.table_before(self.path, self.table, app_id, batch_id, self.storage)
        return RsTable(self.path, table, self.storage) if table is not None else None

    def schema(self) -> pa.Schema:
        return table_schema(self.table)

    def properties(self) -> Mapping[str, str]:
        return dict(self.table.metadata().configuration)

    def set_properties(self, values: Mapping[str, str]) -> None:
        self.table.alter.set_table_properties(dict(values), raise_if_not_exists=False)

    def rows_of_keys(
        self, key: Sequence[str], keys: pa.Table, columns: Sequence[str] | None = None
    ) -> pa.Table:
        return delta_io.rows_of_keys(self.table, self.path, key, keys, columns, self.storage)

    def rows_where(self, equal: Mapping[str, int], null: Sequence[str]) -> pa.Table:
        condition = None
        for column, value in equal.items():
            clause = pc.field(column) == value
            condition = clause if condition is None else condition & clause
        for column in null:
            clause = pc.field(column).is_null()
            condition = clause if condition is None else condition & clause
        dataset = self.table.to_pyarrow_dataset(filesystem=delta_io.table_filesystem(self.path, self.storage))
        return dataset.to_table(filter=condition)

    def merge(self, merge: Merge) -> int:
        return delta_io.merge_marked(self.table, self.path, merge)


class DeltaRsBackend:
    """delta-rs in the driver: no JVM needed (the default). ``storage`` reaches object stores."""

    name = "delta-rs"

    def __init__(self, storage: Storage = LOCAL) -> None:
        self.storage = storage

    def open(self, path: str) -> RsTable | None:
        table = delta_io.open_table(path, self.storage)
        return RsTable(path, table, self.storage) if table is not None else None

    def create(self, path: str, schema: pa.Schema, key: Sequence[str]) -> RsTable:
        return RsTable(path, create_table(path, schema, key, self.storage.table_options()), self.storage)


DELTA_RS = DeltaRsBackend()
BACKENDS = ("delta-rs", "spark")
