"""A key's changes in order through the ``cdc-*`` Kafka sinks, whatever the DataFrame's partitioning.

Kafka keeps the order of one producer's records in a partition. Spark writes each input partition
(a task) with its own producer, and nothing orders two tasks. So the sink needs each key's rows in one
task, in order, with an update's ``-U`` directly before its ``+U`` (the encoders write both as one
event). It checks what it can see and refuses the rest:

* within a task, :class:`UpdatePairs` fails the task at a ``-U`` whose key's next row is not its
  ``+U`` (or that ends the task) and, where the format writes an update as one event, at a ``+U`` with
  no ``-U`` right before it: half an update is never written;
* across tasks, each task reports the 64-bit hashes of the keys it wrote (:class:`KeyHashes`) and the
  driver's commit fails the batch when two tasks wrote one key (:func:`check_disjoint_keys`);
* :func:`order_for_sink` partitions a DataFrame so that both hold.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cdcflow.connectors.errors import ConnectorOptionError, SinkOrderError
from cdcflow.connectors.spark.changelog.exprs import column
from cdcflow.core.model import Change
from cdcflow.core.rowkind import UA, UB

_SHOWN = 80


def fix_hint(key_columns: Sequence[str]) -> str:
    """How to partition the DataFrame, with the user's key columns."""
    keys = ", ".join(repr(name) for name in key_columns)
    return (
        f"keep each key's rows in one partition and in order before writing: "
        f"df = cdcflow.spark.order_for_sink(df, [{keys}], sequence_by=[...the stream position, e.g. "
        f"'partition', 'offset'...]), which is df.repartition({keys}).sortWithinPartitions({keys}, "
        "<sequence>, -U before +U)"
    )


def key_text(row: Mapping[str, Any], key_columns: Sequence[str]) -> str:
    text = ", ".join(f"{name}={row.get(name)!r}" for name in key_columns)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


class UpdatePairs:
    """Checks one task's changes: every ``-U`` directly followed (for its key) by its ``+U``, and, when
    the encoder writes an update as one event (``pairs_updates``), every ``+U`` directly preceded by
    its ``-U``. ``check`` runs before the change reaches the encoder, ``finish`` before its flush."""

    def __init__(self, key_columns: Sequence[str], *, pairs_updates: bool, task: int | None) -> None:
        self._columns = tuple(key_columns)
        self._pairs = pairs_updates
        self._where = "this task" if task is None else f"task {task} (input partition {task})"
        self._pending: dict[Hashable, tuple[int, str]] = {}

    def check(self, change: Change, key: Hashable, position: int) -> None:
        if not self._pairs:
            return
        pending = self._pending
        kind = change.kind
        if key in pending:
            if kind is UA:
                del pending[key]
                return
            self._fail_before(*pending[key], f"the key's next row is a {kind.value} (row {position})")
        if kind is UB:
            pending[key] = (position, key_text(change.row, self._columns))
        elif kind is UA:
            raise SinkOrderError(
                f"the +U of key {key_text(change.row, self._columns)} (row {position} of {self._where}) has "
                "no -U of the same key directly before it: the update's -U is in another task (the "
                "DataFrame's partitioning split the pair) or is missing, and its +U alone would write half "
                f"an update. Nothing of this update was written. Fix: {fix_hint(self._columns)}. For an "
                "upsert changelog (no -U rows at all), write upserts instead: debezium-json with "
                "'changelog-mode'='upsert', or the cdc-upsert-kafka sink"
            )

    def finish(self) -> None:
        """End of the task's input: a ``-U`` still waiting lost its ``+U`` to another task."""
        if self._pending:
            position, key = next(iter(self._pending.values()))
            self._fail_before(position, key, "the task's input ended first")

    def _fail_before(self, position: int, key: str, instead: str) -> None:
        raise SinkOrderError(
            f"the -U of key {key} (row {position} of {self._where}) is not directly followed by its +U: "
            f"{instead}. The update's +U is in another task (the DataFrame's partitioning split the pair) "
            f"or out of order, and the -U alone would write half an update. Nothing of this update was "
            f"written. Fix: {fix_hint(self._columns)}"
        )


class KeyHashes:
    """The distinct keys a task wrote, as 64-bit hashes (8 bytes a key in the commit message)."""

    def __init__(self) -> None:
        self._seen: set[int] = set()

    def add(self, key: Hashable) -> None:
        # repr, not hash(): Python salts str hashes per process, and the tasks run in different ones.
        digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
        self._seen.add(int.from_bytes(digest, "little"))

    def packed(self) -> bytes:
        return np.fromiter(self._seen, dtype=np.uint64, count=len(self._seen)).tobytes()


def check_disjoint_keys(reports: Sequence[tuple[int, bytes]], batch: str, key_columns: Sequence[str]) -> None:
    """Fail when two tasks' reports (``(task, packed key hashes)``) share a key."""
    arrays = [np.frombuffer(packed, dtype=np.uint64) for _, packed in reports]
    if sum(len(a) for a in arrays) < 2:
        return
    hashes = np.concatenate(arrays)
    tasks = np.repeat(np.array([task for task, _ in reports], dtype=np.int64), [len(a) for a in arrays])
    order = np.argsort(hashes, kind="stable")
    hashes, tasks = hashes[order], tasks[order]
    shared = hashes[1:] == hashes[:-1]  # a task reports each key once: equal neighbours are two tasks
    if not shared.any():
        return
    count = len(np.unique(hashes[1:][shared]))
    involved = sorted({int(t) for t in np.concatenate([tasks[1:][shared], tasks[:-1][shared]])})
    shown = ", ".join(str(t) for t in involved[:10]) + (", ..." if len(involved) > 10 else "")
    raise SinkOrderError(
        f"{count} key(s) were written by more than one task of {batch} (tasks {shown}): Spark writes each "
        "task with its own producer and nothing orders two tasks, so the topic may hold these keys' "
        "changes out of order. The batch fails here so that nothing builds on it (a stream writes it again "
        f"on restart, from its checkpoint). Fix: {fix_hint(key_columns)}. A cdc-* source read straight "
        "into this sink splits a Kafka partition's range (or a file) into several tasks above "
        "maxRecordsPerPartition (or for minPartitions): bound each micro-batch below it "
        "(maxOffsetsPerTrigger / maxBytesPerTrigger) or raise it, and leave minPartitions unset. Or set "
        "keyOrderCheck=false if the order of a key's changes does not matter downstream"
    )


def order_for_sink(
    df: DataFrame,
    key_columns: Sequence[str],
    *,
    sequence_by: Sequence[str] = (),
    row_kind_column: str = "_row_kind",
) -> DataFrame:
    """``df`` with each key's rows in one partition, in order, as the ``cdc-*`` sinks need them.

    With ``sequence_by`` (the stream position, e.g. the ``partition`` and ``offset`` metadata
    columns) each partition is sorted by key, sequence and ``-U`` before ``+U``: the order is right
    whatever ``df``'s partitioning. Without it, rows keep the order they had in their input
    partition, which is right only if each key's rows were in one input partition, in order (Spark
    does not order rows that come from different input partitions). Drop the sequence columns after
    this call if they are not table columns: a projection keeps the order.
    """
    names = set(df.columns)
    for name in (*key_columns, *sequence_by, row_kind_column):
        if name not in names:
            raise ConnectorOptionError(
                f"order_for_sink: '{name}' is not a column of the DataFrame {df.columns}"
            )
    if not key_columns:
        raise ConnectorOptionError("order_for_sink needs the key columns (the sink's keyColumns)")
    keys = [column(name) for name in key_columns]
    arranged = df.repartition(*keys)
    if not sequence_by:
        return arranged
    after_last = F.when(column(row_kind_column) == "+U", 1).otherwise(0)
    return arranged.sortWithinPartitions(*keys, *(column(name) for name in sequence_by), after_last)
