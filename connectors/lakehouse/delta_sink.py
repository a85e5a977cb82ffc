"""The Spark side of the Delta sink: each micro-batch of a changelog DataFrame applied exactly once.

    query = apply_changes(changelog_df, "/lake/products", key=["id"], checkpoint="/chk/products")

Each batch is collected to the driver as Arrow (``DataFrame.toArrow``) and applied by one delta-rs
merge (:mod:`.apply`); the batch id Spark replays after a failure is found in the Delta log and
skipped. The application id is the streaming query's id, read from the checkpoint, so a query that
restarts from its checkpoint keeps it; a new checkpoint is a new query that applies everything again.
An explicit ``app_id`` is recorded in the checkpoint and must stay with it (:mod:`.app_identity`).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from cdcflow.connectors.errors import ConnectorOptionError
from cdcflow.connectors.lakehouse import app_identity
from cdcflow.connectors.lakehouse.apply import ApplyOptions, BatchApplied, DeltaChangeApplier, Materialize
from cdcflow.connectors.lakehouse.control import OnTruncate
from cdcflow.connectors.lakehouse.table_io import BACKENDS, DELTA_RS, TableBackend

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

STATE_DIR = "cdcflow-key-state"


def checkpoint_query_id(checkpoint: str) -> str:
    """The id Spark keeps in ``<checkpoint>/metadata``: stable across restarts from the checkpoint."""
    path = os.path.join(checkpoint.removeprefix("file://"), "metadata")
    try:
        with open(path, encoding="utf-8") as handle:
            return str(json.loads(handle.readline())["id"])
    except (OSError, ValueError, KeyError) as error:
        raise ConnectorOptionError(
            f"cannot read the streaming query id from {path} ({error}); the Delta sink needs a local or "
            "mounted checkpointLocation (it also records an explicit app_id there)"
        ) from None


@dataclass
class SinkProgress:
    """Totals over the batches a sink applied in this process (read by the progress line)."""

    batches: int = 0
    skipped: int = 0
    changes: int = 0
    upserts: int = 0
    deletes: int = 0
    late: int = 0
    restarts: int = 0
    unmatched_retractions: int = 0
    unavailable_unfilled: int = 0
    truncates: int = 0
    control_events: int = 0
    apply_seconds: float = 0.0
    last: BatchApplied | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, applied: BatchApplied) -> None:
        with self.lock:
            self.batches += 1
            self.skipped += int(applied.skipped)
            self.changes += applied.changes
            self.upserts += applied.upserts
            self.deletes += applied.deletes
            self.late += applied.late
            self.restarts += applied.restarts
            self.unmatched_retractions += applied.unmatched_retractions
            self.unavailable_unfilled += applied.unavailable_unfilled
            self.truncates += applied.truncates
            self.control_events += applied.control_events
            self.apply_seconds += applied.seconds
            self.last = applied


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
    ) -> None:
        if backend not in BACKENDS:
            raise ConnectorOptionError(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
        self.backend = backend
        self._tables: TableBackend | None = DELTA_RS if backend == "delta-rs" else None
        self.target = target
        self.options = options
        self.checkpoint = checkpoint
        self.app_id = app_id
        self.progress = SinkProgress()
        self.on_batch = on_batch
        self._applier: DeltaChangeApplier | None = None

    def check_identity(self) -> None:
        """Before the query starts: refuse an app id that does not belong to the checkpoint (see
        :mod:`.app_identity`). A new checkpoint without ``app_id`` is a new query: nothing to check."""
        if self.app_id is None and not os.path.exists(os.path.join(self._checkpoint_dir(), "metadata")):
            return
        app_identity.claim(
            self.checkpoint,
            self._app_id(),
            self.target,
            self._state_path(),
            record=False,
            chosen=self.app_id is not None,
        )

    def bind(self, spark: SparkSession) -> None:
        """Before the query starts: set up the back end in ``spark`` (fails with the fix when the
        Spark back end's Delta jars or session extension are missing)."""
        if self._tables is None:
            from cdcflow.connectors.lakehouse.spark_delta import SparkDeltaBackend

            self._tables = SparkDeltaBackend(spark)

    def applier(self, spark: SparkSession | None = None) -> DeltaChangeApplier:
        if self._tables is None and spark is not None:
            self.bind(spark)
        if self._tables is None:
            raise ConnectorOptionError("the Spark back end needs the batch's SparkSession: bind(spark)")
        if self._applier is None:
            app_id, state = self._app_id(), self._state_path()
            app_identity.claim(
                self.checkpoint, app_id, self.target, state, record=True, chosen=self.app_id is not None
            )
            self._applier = DeltaChangeApplier(
                self.target, self.options, app_id=app_id, state_path=state, backend=self._tables
            )
        return self._applier

    def _checkpoint_dir(self) -> str:
        return app_identity.local_checkpoint(self.checkpoint)

    def _app_id(self) -> str:
        return self.app_id or f"cdcflow-{checkpoint_query_id(self.checkpoint)}"

    def _state_path(self) -> str | None:
        return os.path.join(self._checkpoint_dir(), STATE_DIR) if self.options.stateful else None

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        applier = self.applier(batch.sparkSession if self._tables is None else None)
        applied = applier.apply(batch.toArrow(), batch_id) if not applier.done(batch_id) else None
        result = applied or BatchApplied(batch_id, skipped=True)
        self.progress.add(result)
        if self.on_batch is not None:
            self.on_batch(result)


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
    **options: object,
) -> StreamingQuery:
    """Start a streaming query applying ``changelog`` (with a row-kind column) to a Delta table.

    ``options`` are :func:`apply_options`' keywords (sequence_by, materialize, upsert_key, ...);
    ``trigger`` is ``writeStream.trigger``'s keywords, e.g. ``{"availableNow": True}``; ``backend``
    is who merges: ``delta-rs`` (in the driver) or ``spark`` (Delta Lake's jars, on the executors).
    """
    if not changelog.isStreaming:
        raise ConnectorOptionError(
            "apply_changes needs a streaming DataFrame; apply a batch DataFrame with "
            "DeltaChangeApplier(target, apply_options(...), app_id=...).apply(df.toArrow(), batch_id)"
        )
    sink = DeltaSink(
        target,
        apply_options(key, **options),  # type: ignore[arg-type]
        checkpoint,
        app_id,
        backend=backend,
    )
    sink.check_identity()
    sink.bind(changelog.sparkSession)
    writer = changelog.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
    if trigger:
        writer = writer.trigger(**trigger)
    return writer.start()
