"""The Spark side of the Delta sink: each micro-batch of a changelog DataFrame applied exactly once.

    query = apply_changes(changelog_df, "/lake/products", key=["id"], checkpoint="/chk/products")

Each batch is collected to the driver as Arrow (``DataFrame.toArrow``) and applied by one delta-rs
merge (:mod:`.delta.apply`); the batch id Spark replays after a failure is found in the Delta log and
skipped. The application id is the streaming query's id, read from the checkpoint, so a query that
restarts from its checkpoint keeps it; a new checkpoint is a new query that applies everything again.
An explicit ``app_id`` is recorded in the checkpoint and must stay with it (:mod:`.delta.app_identity`).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from cdcflow.connectors.errors import ConnectorOptionError
from cdcflow.connectors.lakehouse import upsert_stream
from cdcflow.connectors.lakehouse.delta import app_identity
from cdcflow.connectors.lakehouse.delta.apply import DeltaChangeApplier
from cdcflow.connectors.lakehouse.delta.batch import OnTruncate
from cdcflow.connectors.lakehouse.delta.dead_letters import DEAD_LETTER_DIR, DeadLetterFiles
from cdcflow.connectors.lakehouse.delta.history_apply import HistoryApplier
from cdcflow.connectors.lakehouse.delta.options import ApplyOptions, Materialize, Unsequenced
from cdcflow.connectors.lakehouse.delta.pending import PendingBatches
from cdcflow.connectors.lakehouse.delta.result import BatchApplied
from cdcflow.connectors.lakehouse.delta.storage import LOCAL, Storage, is_remote, join
from cdcflow.connectors.lakehouse.delta.tables import BACKENDS, DeltaRsBackend, TableBackend
from cdcflow.connectors.spark import handoff
from cdcflow.formats.redact import redact

if TYPE_CHECKING:
    from concurrent.futures import Future, ThreadPoolExecutor

    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

STATE_DIR = "cdcflow-key-state"


def checkpoint_query_id(checkpoint: str, storage: Storage = LOCAL) -> str:
    """The id Spark keeps in ``<checkpoint>/metadata``: stable across restarts from the checkpoint."""
    path = join(checkpoint, "metadata")
    try:
        text = storage.read_text(path)
        if text is None:
            raise FileNotFoundError("no such file")
        return str(json.loads(text.splitlines()[0])["id"])
    except (OSError, ValueError, KeyError, IndexError) as error:
        raise ConnectorOptionError(
            f"cannot read the streaming query id from {redact(path)} ({storage.reason(error)}); the Delta "
            "sink reads it from the checkpointLocation Spark writes (and records an explicit app_id there): "
            "check that the checkpoint is reachable with the storage options given"
        ) from None


@dataclass(frozen=True)
class Progress:
    """Totals over the batches a sink applied in this process, up to one of them."""

    batches: int = 0
    skipped: int = 0
    totals: BatchApplied = field(default_factory=lambda: BatchApplied(-1))
    """the counts of every batch added up; ``seconds``: the time spent applying"""
    last: BatchApplied | None = None

    def plus(self, applied: BatchApplied) -> Progress:
        return Progress(
            self.batches + 1, self.skipped + int(applied.skipped), self.totals.plus(applied), applied
        )


class SinkProgress:
    """The sink's :class:`Progress` (read by the progress line), also as it was after each recent batch."""

    RECENT = 64

    def __init__(self) -> None:
        self.now = Progress()
        self._recent: deque[Progress] = deque(maxlen=self.RECENT)
        self._lock = threading.Lock()

    def add(self, applied: BatchApplied) -> None:
        with self._lock:
            self.now = self.now.plus(applied)
            self._recent.append(self.now)

    def after(self, shown: int) -> list[Progress]:
        """The progress after each recent batch past the first ``shown`` batches, in order."""
        with self._lock:
            return [p for p in self._recent if p.batches > shown]

    @property
    def batches(self) -> int:
        return self.now.batches

    @property
    def skipped(self) -> int:
        return self.now.skipped

    @property
    def totals(self) -> BatchApplied:
        return self.now.totals

    @property
    def last(self) -> BatchApplied | None:
        return self.now.last


class DeltaSink:
    """A ``foreachBatch`` function applying each micro-batch to the Delta table at ``target``."""

    def __init__(
        self,
        target: str,
        options: ApplyOptions,
        checkpoint: str,
        app_id: str | None = None,
        on_batch: Callable[[BatchApplied], None] | None = None,
        backend: str = "delta-rs",
        run_replays: bool = False,
        storage_options: Mapping[str, str] | None = None,
        pipeline: bool = False,
        history_time: str | None = None,
    ) -> None:
        """``run_replays``: execute a replayed batch's plan although the table has it (a stateful query,
        e.g. an aggregation, fails in Spark 4.2 when a batch leaves its state store partitions
        uncommitted: STATE_STORE_COMMIT_VALIDATION_FAILED). ``storage_options``: delta-rs's options
        for a target or checkpoint on an object store (:mod:`.delta.storage`).

        ``pipeline`` (delta-rs back end): apply batch N in a background thread while Spark decodes
        N+1, each batch first written to the checkpoint's pending log (:mod:`.delta.pending`) so that one
        Spark committed survives the driver; the owner calls :meth:`recover` before the query starts
        and :meth:`drain` after it ends. An apply's error is raised by the next batch (failing the
        query before Spark commits that one) or by :meth:`drain`.

        ``history_time`` (delta-rs back end): keep the table as SCD2 history, each version starting at
        its change's value of this column (:mod:`.delta.history_apply`)."""
        if backend not in BACKENDS:
            raise ConnectorOptionError(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
        self.backend = backend
        self.storage = Storage(dict(storage_options or {}))
        self._tables: TableBackend | None = DeltaRsBackend(self.storage) if backend == "delta-rs" else None
        self.target = target
        self.options = options
        self.checkpoint = checkpoint
        self.app_id = app_id
        self.progress = SinkProgress()
        self.on_batch = on_batch
        self.run_replays = run_replays
        self._applier: DeltaChangeApplier | HistoryApplier | None = None
        if history_time is not None and backend != "delta-rs":
            raise ConnectorOptionError("--mode scd2 writes with delta-rs: use --backend delta-rs")
        self.history_time = history_time
        if pipeline and backend != "delta-rs":
            raise ConnectorOptionError("pipeline=True applies with delta-rs: use backend='delta-rs'")
        self._pending = PendingBatches(checkpoint, self.storage) if pipeline else None
        self._worker: ThreadPoolExecutor | None = None
        self._running: Future[None] | None = None
        self._recovered = False

    def check_identity(self) -> None:
        """Before the query starts: refuse a target or checkpoint this sink cannot reach (see
        :mod:`.delta.storage`), and an app id that does not belong to the checkpoint (see
        :mod:`.delta.app_identity`). A new checkpoint without ``app_id`` is a new query: nothing to check."""
        self.storage.check(self.target, "the target")
        self.storage.check(self.checkpoint, "the checkpoint")
        if self.backend == "delta-rs":
            self.storage.reachable(self.target, "the target")
        self.storage.reachable(self.checkpoint, "the checkpoint")
        if self.app_id is None and not self.storage.exists(join(self.checkpoint, "metadata")):
            return
        app_identity.claim(
            self.checkpoint,
            self._app_id(),
            self.target,
            self._state_path(),
            record=False,
            chosen=self.app_id is not None,
            storage=self.storage,
        )

    def bind(self, spark: SparkSession) -> None:
        """Before the query starts: set up the back end in ``spark`` (fails with the fix when the
        Spark back end's Delta jars or session extension are missing, or Spark has no file system for
        the checkpoint's store)."""
        from cdcflow.connectors.lakehouse.spark_storage import require_filesystem

        require_filesystem(spark, self.checkpoint, "the checkpoint")
        if self.backend == "spark" and is_remote(self.target):
            require_filesystem(spark, self.target, "the target (--backend spark writes it with Spark)")
        if self._tables is None:
            from cdcflow.connectors.lakehouse.spark_backend import SparkDeltaBackend

            self._tables = SparkDeltaBackend(spark)

    def applier(self, spark: SparkSession | None = None) -> DeltaChangeApplier | HistoryApplier:
        if self._tables is None and spark is not None:
            self.bind(spark)
        if self._tables is None:
            raise ConnectorOptionError("the Spark back end needs the batch's SparkSession: bind(spark)")
        if self._applier is None:
            app_id, state = self._app_id(), self._state_path()
            app_identity.claim(
                self.checkpoint,
                app_id,
                self.target,
                state,
                record=True,
                chosen=self.app_id is not None,
                storage=self.storage,
            )
            if self.history_time is not None:
                self._applier = HistoryApplier(
                    self.target, self.options, self.history_time, app_id=app_id, storage=self.storage
                )
                return self._applier
            self._applier = DeltaChangeApplier(
                self.target,
                self.options,
                app_id=app_id,
                state_path=state,
                backend=self._tables,
                dead_letters=DeadLetterFiles(self.dead_letter_path, self.storage),
            )
        return self._applier

    def _app_id(self) -> str:
        return self.app_id or f"cdcflow-{checkpoint_query_id(self.checkpoint, self.storage)}"

    def _state_path(self) -> str | None:
        stateful = self.options.stateful and self.history_time is None
        return join(self.checkpoint, STATE_DIR) if stateful else None

    @property
    def dead_letter_path(self) -> str:
        """Where the changes the applier leaves out go, one file per batch (:mod:`.delta.dead_letters`)."""
        return join(self.checkpoint, DEAD_LETTER_DIR)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        if self._pending is not None:
            self._pipelined(batch, batch_id)
            return
        applier = self.applier(batch.sparkSession if self._tables is None else None)
        applied = None
        if not applier.done(batch_id):
            table, handed = collect(batch)
            applied = applier.apply(table, batch_id)
            handoff.remove(handed)
        if applied is None and self.run_replays:
            batch.write.format("noop").mode("overwrite").save()
        self._report(applied or BatchApplied(batch_id, skipped=True))

    def _report(self, result: BatchApplied) -> None:
        self.progress.add(result)
        if self.on_batch is not None:
            self.on_batch(result)

    def _pipelined(self, batch: DataFrame, batch_id: int) -> None:
        assert self._pending is not None  # noqa: S101 - only called with a pending log
        self.recover()
        # With a batch in flight this one is new: Spark replays batches only when a query starts.
        if self._running is None and self.applier().done(batch_id):
            self._report(BatchApplied(batch_id, skipped=True))
            return
        table, handed = collect(batch)  # Spark decodes this batch while the worker applies the one before
        self.drain()
        if handed:
            self._pending.adopt(batch_id, handed)
        else:
            self._pending.write(batch_id, table)
        if self._worker is None:
            from concurrent.futures import ThreadPoolExecutor

            self._worker = ThreadPoolExecutor(1, thread_name_prefix="cdcflow-apply")
        self._running = self._worker.submit(self._apply_pending, table, batch_id)

    def _apply_pending(self, table: pa.Table, batch_id: int) -> None:
        assert self._pending is not None  # noqa: S101 - only called with a pending log
        applied = self.applier().apply(table, batch_id)
        self._pending.remove(batch_id)
        self._report(applied)

    def recover(self) -> None:
        """Apply the batches Spark committed that a driver which died left in the pending log."""
        if self._pending is None or self._recovered:
            return
        self._pending.discard_partial()
        for batch_id in self._pending.ids():
            if not self.applier().done(batch_id):
                self._apply_pending(self._pending.read(batch_id), batch_id)
            self._pending.remove(batch_id)
        self._recovered = True

    def drain(self) -> None:
        """Wait for the batch being applied; raise its error (the pending log keeps the batch)."""
        running, self._running = self._running, None
        if running is not None:
            running.result()

    def close(self) -> None:
        """After a failed query: let the batch being applied finish (its error, if any, is dropped:
        its pending file stays for the next run) and stop the worker."""
        with contextlib.suppress(Exception):
            self.drain()
        if self._worker is not None:
            self._worker.shutdown()
            self._worker = None


def collect(batch: DataFrame) -> tuple[pa.Table, list[str]]:
    """The batch's changelog as Arrow (``toArrow``), and the handoff files it was read from: a source
    with ``handoffPath`` yields the paths of the Arrow files its tasks wrote
    (:mod:`cdcflow.connectors.spark.handoff`)."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    carried = (
        batch.schema.fields[0].metadata.get(handoff.CHANGELOG_KEY)
        if handoff.is_handoff(batch.columns)
        else None
    )
    if carried is None:
        return batch.toArrow(), []
    changelog = StructType.fromJson(json.loads(carried))
    schema = to_arrow_schema(changelog, error_on_duplicated_field_names_in_struct=True, timezone="UTC")
    listed = batch.toArrow()
    paths = [str(path) for path in listed.column(handoff.FILE_COLUMN).to_pylist()]
    table = handoff.read(paths, schema)
    expected = sum(listed.column(handoff.ROWS_COLUMN).to_pylist())
    if table.num_rows != expected:
        raise ConnectorOptionError(
            f"the handoff files of this micro-batch hold {table.num_rows} rows, their tasks wrote "
            f"{expected}: another job writes the same handoffPath; give each query its own"
        )
    return table, paths


def apply_options(
    key: Sequence[str],
    *,
    sequence_by: str | None = None,
    materialize: str | Materialize = Materialize.AUTO,
    upsert_key: Sequence[str] | None = None,
    row_kind_column: str = "_row_kind",
    exclude: Sequence[str] = (),
    delete_retention: timedelta = timedelta(days=7),
    state_ttl: timedelta | None = None,
    restart_by: str | None = None,
    unavailable_column: str | None = None,
    old_key_column: str | None = None,
    new_key_column: str | None = None,
    control_column: str | None = None,
    on_truncate: str | OnTruncate = OnTruncate.APPLY,
    unsequenced: str | Unsequenced = Unsequenced.DEAD_LETTER,
) -> ApplyOptions:
    return ApplyOptions(
        key=tuple(key),
        sequence_by=sequence_by,
        materialize=Materialize.parse(materialize),
        upsert_key=tuple(upsert_key) if upsert_key is not None else None,
        row_kind_column=row_kind_column,
        exclude=tuple(exclude),
        delete_retention=delete_retention,
        state_ttl=state_ttl,
        restart_by=restart_by,
        unavailable_column=unavailable_column,
        old_key_column=old_key_column,
        new_key_column=new_key_column,
        control_column=control_column,
        on_truncate=OnTruncate.parse(on_truncate),
        unsequenced=Unsequenced.parse(unsequenced),
    )


def apply_changes(
    changelog: DataFrame,
    target: str,
    *,
    key: Sequence[str],
    checkpoint: str,
    trigger: Mapping[str, Any] | None = None,
    app_id: str | None = None,
    backend: str = "delta-rs",
    output_mode: str | None = None,
    storage_options: Mapping[str, str] | None = None,
    **options: object,
) -> StreamingQuery:
    """Start a streaming query applying ``changelog`` (with a row-kind column) to a Delta table.

    ``options`` are :func:`apply_options`' keywords (sequence_by, materialize, upsert_key, ...);
    ``trigger`` is ``writeStream.trigger``'s keywords, e.g. ``{"availableNow": True}``; ``backend``
    is who merges: ``delta-rs`` (in the driver) or ``spark`` (Delta Lake's jars, on the executors).
    ``storage_options`` are delta-rs's, for a target or checkpoint on S3, ADLS or GCS (e.g.
    ``{"AWS_REGION": "eu-west-1"}``; the environment's ``AWS_*`` variables count too); Spark writes the
    checkpoint with the session's own file system settings (``spark.hadoop.fs.s3a.*``).

    A DataFrame without the row-kind column (or with ``row_kind_column=None``), such as a streaming
    aggregation, is applied as upserts keyed by ``key`` (:mod:`.upsert_stream`), in ``update``
    ``output_mode`` unless given (``append`` otherwise).
    """
    if not changelog.isStreaming:
        raise ConnectorOptionError(
            "apply_changes needs a streaming DataFrame; apply a batch DataFrame with "
            "DeltaChangeApplier(target, apply_options(...), app_id=...).apply(df.toArrow(), batch_id)"
        )
    stream = upsert_stream.to_apply(changelog, key, options)
    mode = upsert_stream.output_mode(output_mode, stream.upserts)
    sink = DeltaSink(
        target,
        apply_options(stream.key, **stream.options),  # type: ignore[arg-type]
        checkpoint,
        app_id,
        backend=backend,
        run_replays=True,
        storage_options=storage_options,
    )
    sink.check_identity()
    sink.bind(changelog.sparkSession)
    writer = stream.frame.writeStream.outputMode(mode).foreachBatch(sink)
    writer = writer.option("checkpointLocation", checkpoint)
    if trigger:
        writer = writer.trigger(**trigger)
    return writer.start()
