"""``--progress-json FILE``: one JSON object per applied micro-batch, for monitoring.

Each line is what one batch of one table did (``{"time", "table", "batch", "changes", "upserts", ...,
"lag", "dead_letters"}``), appended and flushed as the batch commits: a whole-database job's tables
each write their own lines into the one file.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import IO, TYPE_CHECKING

from cdcflow.connectors.lakehouse.delta.result import BatchApplied
from cdcflow.connectors.lakehouse.ingest_report import lag_text

if TYPE_CHECKING:
    from pyspark.sql.streaming.query import StreamingQuery

    from cdcflow.connectors.spark.accounting import CountsSince


class ProgressLog:
    def __init__(self, path: str) -> None:
        self.path = path
        self._file: IO[str] | None = None
        self._lock = threading.Lock()

    def recorder(
        self,
        table: str,
        on_batch: Callable[[BatchApplied], None],
        query: Callable[[], StreamingQuery | None],
        counts: Callable[[], CountsSince | None],
    ) -> Callable[[BatchApplied], None]:
        """``on_batch``, after writing the batch's line for ``table``."""

        def record(applied: BatchApplied) -> None:
            on_batch(applied)
            line = {"time": round(time.time(), 3), "table": table, "batch": applied.batch_id}
            line |= {k: v for k, v in asdict(applied).items() if k != "batch_id"}
            running = query()
            line["lag"] = lag_text(running.lastProgress) if running is not None else None
            counted = counts()
            line["dead_letters"] = counted.counts().dead_letters if counted is not None else None
            self._write(json.dumps(line))

        return record

    def _write(self, text: str) -> None:
        with self._lock:
            if self._file is None:
                self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept for the run
            self._file.write(text + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
