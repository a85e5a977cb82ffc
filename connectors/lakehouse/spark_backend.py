"""Delta on Spark: the applier's table I/O through Delta Lake's own jars (delta-spark).

The driver plans each batch as the delta-rs back end does (:mod:`.delta.apply`); the MERGE, the reads of
the batch's keys and the key-state merge run as Spark jobs on the executors, so the target's rows are
read and rewritten there, never collected. Exactly once: each merge runs with the session confs
``spark.databricks.delta.write.txnAppId``/``txnVersion``, which Delta records as the commit's ``txn``
action (the same ``(app_id, batch_id)`` delta-rs records) and which make Delta skip a merge whose
batch the table already has.

Delta's jars come from the session: ``spark-submit --packages io.delta:delta-spark_2.13:4.4.0`` with
``--conf spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension --conf
spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog``, or, for the local
session ``cdcflow ingest`` starts, from ``--delta-jars`` / ``CDCFLOW_DELTA_JARS`` (jar files or
folders, comma separated).
"""

from __future__ import annotations

import glob
import json
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from deltalake import Schema as DeltaSchema

from cdcflow.connectors.errors import SparkSetupError
from cdcflow.connectors.lakehouse.delta.merge import SPARK_SQL, Merge
from cdcflow.connectors.lakehouse.delta.storage import is_remote
from cdcflow.connectors.lakehouse.delta.tables import conform_to

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
SNAPSHOT_PARTITIONS = "spark.databricks.delta.snapshotPartitions"
JARS_ENV = "CDCFLOW_DELTA_JARS"
_INHERITED = (SNAPSHOT_PARTITIONS, "spark.sql.shuffle.partitions", "spark.sql.session.timeZone")
PACKAGE = "io.delta:delta-spark_2.13:4.4.0"
_FIX = (
    f"run under spark-submit --packages {PACKAGE} --conf spark.sql.extensions={EXTENSION} --conf "
    f"spark.sql.catalog.spark_catalog={CATALOG}, or give cdcflow ingest --delta-jars (or {JARS_ENV}) the "
    "folder of delta-spark's jars (scripts/java_deps.sh delta fetches them), or use --backend delta-rs"
)


def delta_jars(given: str | None = None) -> list[str]:
    """The jar files named by ``given`` (else ``CDCFLOW_DELTA_JARS``): jars or folders, comma separated."""
    text = given if given is not None else os.environ.get(JARS_ENV, "")
    found: list[str] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        if os.path.isdir(part):
            found.extend(sorted(glob.glob(os.path.join(part, "*.jar"))))
        elif os.path.isfile(part):
            found.append(part)
        else:
            raise SparkSetupError(f"Delta jars: {part!r} is neither a jar file nor a folder of jars; {_FIX}")
    if text.strip() and not any("delta-spark" in os.path.basename(j) for j in found):
        raise SparkSetupError(f"Delta jars: no delta-spark jar in {text!r}; {_FIX}")
    return found


def session_config(jars: Sequence[str]) -> dict[str, str]:
    """Builder settings for a local session that runs Delta: its jars, extension and catalog."""
    return {
        "spark.jars": ",".join(jars),
        "spark.sql.extensions": EXTENSION,
        "spark.sql.catalog.spark_catalog": CATALOG,
    }


def require_delta(spark: SparkSession) -> None:
    """Fail with the fix when ``spark`` cannot run Delta Lake's MERGE (jars or extension missing)."""
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:
        raise SparkSetupError(
            f"--backend spark needs a classic (JVM) SparkSession, not Spark Connect; {_FIX}"
        )
    try:
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName("io.delta.tables.DeltaTable", False, loader)
    except Exception:
        raise SparkSetupError(
            f"--backend spark: Delta Lake's classes are not in this Spark session; {_FIX}"
        ) from None
    extensions = spark.conf.get("spark.sql.extensions", None) or ""
    if EXTENSION not in extensions:
        raise SparkSetupError(
            f"--backend spark: the session has Delta's jars but spark.sql.extensions is {extensions!r}, "
            f"without {EXTENSION} (a static setting: it must be set when the session starts); {_FIX}"
        )


_quote, _literal = SPARK_SQL.quote, SPARK_SQL.string


def _struct(schema: pa.Schema) -> StructType:
    """An Arrow schema as the Spark schema Delta stores for it (Delta's schema JSON is Spark's)."""
    from pyspark.sql.types import StructType

    parsed = StructType.fromJson(json.loads(DeltaSchema.from_arrow(schema).to_json()))
    return parsed


def _arrow(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """Spark's Arrow rows cast to the types delta-rs reads the table's columns as."""
    return pa.Table.from_arrays(
        [rows.column(name).cast(schema.field(name).type) for name in rows.schema.names],
        schema=pa.schema([schema.field(name) for name in rows.schema.names]),
    )


@dataclass
class SparkTable:
    """A Delta table read and written by Spark with Delta Lake's jars (``at``: a fixed version)."""

    backend: SparkDeltaBackend
    path: str
    at: int | None = None

    @property
    def spark(self) -> SparkSession:
        return self.backend.spark

    def _snapshot(self, version: int | None = None) -> Any:
        log = self.spark._jvm.org.apache.spark.sql.delta.DeltaLog.forTable(  # type: ignore[union-attr]
            self.spark._jsparkSession, self.path
        )
        version = self.at if version is None else version
        if version is None:
            defaults = [getattr(log, f"update$default${i}")() for i in (1, 2, 3)]
            return log.update(*defaults)
        defaults = [getattr(log, f"getSnapshotAt$default${i}")() for i in (2, 3, 4)]
        return log.getSnapshotAt(version, *defaults)

    def version(self) -> int:
        return int(self._snapshot().version())

    def applied_version(self, app_id: str) -> int:
        return self._applied(self._snapshot(), app_id)

    @staticmethod
    def _applied(snapshot: Any, app_id: str) -> int:
        # The version's checksum file (written by Delta on Spark with each commit) lists the table's
        # application transactions; reading them from the snapshot instead runs a Spark job over the
        # whole log (seconds per call). A version without one (delta-rs writes none) is read the long way.
        checksum = snapshot.checksumOpt()
        listed = checksum.get().setTransactions() if checksum.isDefined() else None
        if listed is not None and listed.isDefined():
            found = listed.get().iterator()
            while found.hasNext():
                transaction = found.next()
                if transaction.appId() == app_id:
                    return int(transaction.version())
            return -1
        applied = snapshot.transactions().get(app_id)
        return int(applied.get()) if applied.isDefined() else -1

    def before(self, app_id: str, batch_id: int) -> SparkTable | None:
        low, high = 0, self.version()
        while low < high:  # the first version whose application transaction has reached batch_id
            middle = (low + high) // 2
            if self._applied(self._snapshot(middle), app_id) >= batch_id:
                high = middle
            else:
                low = middle + 1
        return SparkTable(self.backend, self.path, low - 1) if low > 0 else None

    def schema(self) -> pa.Schema:
        return pa.schema(DeltaSchema.from_json(self._snapshot().schema().json()).to_arrow())

    def properties(self) -> Mapping[str, str]:
        jvm = self.spark._jvm
        configuration = self._snapshot().metadata().configuration()
        return dict(jvm.scala.jdk.javaapi.CollectionConverters.asJava(configuration))  # type: ignore[union-attr]

    def set_properties(self, values: Mapping[str, str]) -> None:
        pairs = ", ".join(f"{_literal(k)} = {_literal(v)}" for k, v in values.items())
        self.spark.sql(f"ALTER TABLE delta.{_quote(self.path)} SET TBLPROPERTIES ({pairs})")

    def _add_columns(self, fields: list[pa.Field]) -> pa.Schema:
        # An empty append that merges its schema: the columns get exactly the types Arrow maps to.
        schema = self.schema()
        empty = pa.schema([*schema, *fields]).empty_table()
        _data_frame(self.spark, empty).write.format("delta").mode("append").option(
            "mergeSchema", "true"
        ).save(self.path)
        return self.schema()

    def _widen_columns(self, fields: list[pa.Field]) -> pa.Schema:
        # On a table whose owner enabled Delta's typeWidening feature, the column's type changes in the
        # metadata alone. Otherwise the table is rewritten once with the wider types, as on delta-rs:
        # the feature would make it unreadable to delta-rs (deltalake 1.6 refuses its reader feature).
        table = f"delta.{_quote(self.path)}"
        if self.properties().get("delta.enableTypeWidening", "").lower() == "true":
            for field in fields:
                column, wider = _quote(field.name), _sql_type(field.type)
                self.spark.sql(f"ALTER TABLE {table} ALTER COLUMN {column} TYPE {wider}")
            return self.schema()
        wider_types = {f.name: _sql_type(f.type) for f in fields}
        rows = self.spark.read.format("delta").load(self.path)
        columns = [
            rows[name].cast(wider_types[name]).alias(name) if name in wider_types else rows[name]
            for name in rows.columns
        ]
        writer = rows.select(*columns).write.format("delta").mode("overwrite")
        writer.option("overwriteSchema", "true").save(self.path)
        return self.schema()

    def _frame(self) -> DataFrame:
        reader = self.spark.read.format("delta")
        if self.at is not None:
            reader = reader.option("versionAsOf", self.at)
        return reader.load(self.path)

    def rows_of_keys(
        self, key: Sequence[str], keys: pa.Table, columns: Sequence[str] | None = None
    ) -> pa.Table:
        from pyspark.sql.functions import broadcast

        schema = self.schema()
        wanted = keys.select(list(key)).group_by(list(key)).aggregate([])
        wanted = wanted.cast(pa.schema([schema.field(c) for c in key]))
        probe = _data_frame(self.spark, wanted)
        rows = self._frame().join(broadcast(probe), list(key), "left_semi")
        if columns is not None:
            rows = rows.select(*(_quote(c) for c in [*key, *(c for c in columns if c not in key)]))
        return _arrow(rows.toArrow(), schema)

    def rows_where(self, equal: Mapping[str, int], null: Sequence[str]) -> pa.Table:
        conditions = [f"{_quote(c)} = {int(v)}" for c, v in equal.items()]
        conditions += [f"{_quote(c)} IS NULL" for c in null]
        rows = self._frame()
        if conditions:
            rows = rows.filter(" AND ".join(conditions))
        return _arrow(rows.toArrow(), self.schema())

    def merge(self, merge: Merge) -> int:
        from delta.tables import DeltaTable

        statement = merge.statement(
            lambda data: conform_to(
                self.schema(), self._add_columns, data, merge.identity, self.path, self._widen_columns
            ),
            SPARK_SQL,
        )
        frame = _data_frame(self.spark, statement.source)
        merger = (
            DeltaTable.forPath(self.spark, self.path)
            .alias("t")
            .merge(frame.alias("s"), statement.on)
            .whenMatchedDelete(condition=statement.delete)
            .whenMatchedUpdate(condition=statement.write, set=dict(statement.update))
            .whenNotMatchedInsert(condition=statement.write, values=dict(statement.insert))
        )
        if statement.delete_unmatched is not None:
            merger = merger.whenNotMatchedBySourceDelete(condition=statement.delete_unmatched)
        with self.backend.transaction(merge.app_id, merge.batch_id):
            merger.execute()
        return self.version()


def _sql_type(data_type: pa.DataType) -> str:
    """The Spark SQL type of a column type :func:`.delta.tables.widens` widens to."""
    if pa.types.is_decimal(data_type):
        return f"DECIMAL({data_type.precision}, {data_type.scale})"
    names = {pa.int16(): "SMALLINT", pa.int32(): "INT", pa.int64(): "BIGINT", pa.float64(): "DOUBLE"}
    return names[data_type]


def _data_frame(spark: SparkSession, table: pa.Table) -> DataFrame:
    """``table`` in the back end's own session. PySpark's ``createDataFrame`` makes its session the
    thread's active one; the caller's is put back, so a notebook's ``SparkSession.getActiveSession()``
    (and a ``cdcflow`` command run after ``apply_changes`` in the same process) still finds its own."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    frame = spark.createDataFrame(table, schema=_struct(table.schema))
    if active is not None:
        SparkSession._activeSession = active
        spark._jvm.SparkSession.setActiveSession(active._jsparkSession)  # type: ignore[union-attr]
    return frame


class SparkDeltaBackend:
    """Delta Lake's jars in ``spark``: merges run as Spark jobs, exactly once by Delta's txn confs."""

    name = "spark"

    def __init__(self, spark: SparkSession) -> None:
        require_delta(spark)
        # A session of its own (same context): the transaction settings of its merges never reach
        # another writer of the caller's session.
        self.spark = spark.newSession()
        for name in _INHERITED:
            value = spark.conf.get(name, None)
            if value is not None:
                self.spark.conf.set(name, value)
        self._lock = threading.Lock()
        # Delta's default of 50 partitions for reading a table's log state costs seconds per batch on
        # small tables; one per core is plenty for the state of the tables an ingestion writes.
        if spark.conf.get(SNAPSHOT_PARTITIONS, None) is None:
            self.spark.conf.set(SNAPSHOT_PARTITIONS, str(max(1, spark.sparkContext.defaultParallelism)))

    def transaction(self, app_id: str, batch_id: int) -> _Transaction:
        return _Transaction(self, app_id, batch_id)

    def open(self, path: str) -> SparkTable | None:
        from delta.tables import DeltaTable

        path = _located(path)
        return SparkTable(self, path) if DeltaTable.isDeltaTable(self.spark, path) else None

    def create(self, path: str, schema: pa.Schema, key: Sequence[str]) -> SparkTable:
        from delta.tables import DeltaTable

        path = _located(path)
        fields = pa.schema([pa.field(f.name, f.type, f.nullable and f.name not in key) for f in schema])
        DeltaTable.createIfNotExists(self.spark).location(path).addColumns(_struct(fields)).execute()
        return SparkTable(self, path)


def _located(path: str) -> str:
    """A local path made absolute, as delta-rs resolves it: Spark SQL takes ``delta.`path``` as a table
    name unless the path is absolute."""
    return path if is_remote(path) else os.path.abspath(path.removeprefix("file://"))


class _Transaction:
    """The session confs that make Delta record (and skip a repeat of) ``(app_id, batch_id)``."""

    def __init__(self, backend: SparkDeltaBackend, app_id: str, batch_id: int) -> None:
        self.backend, self.app_id, self.batch_id = backend, app_id, batch_id

    def __enter__(self) -> None:
        self.backend._lock.acquire()
        conf = self.backend.spark.conf
        conf.set(TXN_APP_ID, self.app_id)
        conf.set(TXN_VERSION, str(self.batch_id))

    def __exit__(self, *exc: object) -> None:
        conf = self.backend.spark.conf
        conf.unset(TXN_APP_ID)
        conf.unset(TXN_VERSION)
        self.backend._lock.release()
