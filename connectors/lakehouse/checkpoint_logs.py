"""Spark's logs of a streaming query (offsets, commits, metadata) written to a local checkpoint without
forking processes.

Spark writes its logs through Hadoop's ``FileContext`` by default: on a local disk without Hadoop's
native library (pyspark ships none) each log file costs some 15 forked ``readlink`` and ``chmod``
processes, ~45 ms for the offset log and as much for the commit log of every micro-batch on two cores.
Spark's ``FileSystem``-based manager writes the same files through Hadoop's ``FileSystem`` API in
~15 ms each. Its rename of a finished log file is a check for the file and then a rename, where
``FileContext``'s fails if the file exists: the two differ only for two queries writing one checkpoint
at once, which the job's checkpoint lease makes rare (:mod:`.checkpoint_lease`: a job that stalled
past it is taken over and fails at its next batch).

A query keeps a copy of its session's settings from ``start()`` on, and makes its logs with the copy:
:func:`local_logs` sets ``spark.sql.streaming.checkpointFileManagerClass`` for that moment only, and
leaves a manager the user chose alone (a session setting, or Hadoop's ``spark.hadoop.`` one).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from cdcflow.connectors.lakehouse.delta.storage import is_remote

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MANAGER_KEY = "spark.sql.streaming.checkpointFileManagerClass"
FILE_SYSTEM_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)
_starting = threading.Lock()  # one query's start at a time holds the setting (a database job starts many)


@contextmanager
def local_logs(session: SparkSession, checkpoint: str) -> Iterator[None]:
    """While a query with ``checkpoint`` starts in ``session``: its logs written through Hadoop's
    ``FileSystem`` API when the checkpoint is on a local disk, the session is a classic one whose Spark
    has the manager, and the user chose no manager."""
    if is_remote(checkpoint) or not _has_manager(session):
        yield
        return
    with _starting:
        if session.conf.get(MANAGER_KEY, None) is not None or _hadoop_setting(session) is not None:
            yield
            return
        session.conf.set(MANAGER_KEY, FILE_SYSTEM_MANAGER)
        try:
            yield
        finally:
            session.conf.unset(MANAGER_KEY)


def _has_manager(session: SparkSession) -> bool:
    jvm = getattr(session, "_jvm", None)  # None through Spark Connect: its server's settings apply
    if jvm is None:
        return False
    try:
        jvm.java.lang.Class.forName(FILE_SYSTEM_MANAGER)
    except Exception:  # noqa: BLE001 - py4j's error for a class this Spark does not have
        return False
    return True


def _hadoop_setting(session: SparkSession) -> str | None:
    value: str | None = session.sparkContext._jsc.hadoopConfiguration().get(MANAGER_KEY)
    return value
