"""A directory of JSON files read as a stream, run with ``availableNow`` from its checkpoint.

Each :meth:`JsonStream.run` is one query start: it takes what arrived since the last run and
returns what it wrote; the query's progress reports (one per micro-batch) are kept on the stream.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

Record = dict[str, Any]

QUERY_TIMEOUT_SECONDS = 180


def per_key(records: Sequence[Record]) -> dict[Any, list[Record]]:
    """Records by their image's ``id``, in order."""
    grouped: dict[Any, list[Record]] = {}
    for record in records:
        image = record.get("after") or record.get("before") or record
        grouped.setdefault(image["id"], []).append(record)
    return grouped


def rows_of(df: DataFrame) -> list[Record]:
    return [row.asDict(recursive=True) for row in df.collect()]


class JsonStream:
    """JSON-lines files under ``root/input``, read as a stream with ``schema``; checkpoint in ``root``."""

    def __init__(self, spark: SparkSession, root: Path, schema: str, **options: str) -> None:
        self.spark = spark
        self.input = root / "input"
        self.checkpoint = root / "checkpoint"
        self.input.mkdir(parents=True)
        self.schema = schema
        self.options = options
        self.files = 0
        self.progress: list[Mapping[str, Any]] = []
        self._modified = time.time() - 86_400

    def append(self, records: Sequence[Record]) -> None:
        """One more file. Spark's file source reads new files by modification time (then listing
        order), so each file gets a later time than the one before: files are read as appended."""
        self.files += 1
        text = "".join(json.dumps(record) + "\n" for record in records)
        path = self.input / f"part-{self.files:04d}.json"
        path.write_text(text)
        os.utime(path, (self._modified + self.files, self._modified + self.files))

    def run(self, transform: Callable[[DataFrame], DataFrame]) -> list[Record]:
        written: list[Record] = []

        def collect(batch: DataFrame, _batch_id: int) -> None:
            written.extend(rows_of(batch))

        source = self.spark.readStream.schema(self.schema).options(**self.options).json(str(self.input))
        query = (
            transform(source)
            .writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(self.checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        if not query.awaitTermination(QUERY_TIMEOUT_SECONDS):
            query.stop()
            pytest.fail(f"the availableNow query did not finish in {QUERY_TIMEOUT_SECONDS} s")
        self.progress.extend(query.recentProgress)
        return written

    def state_operators(self) -> list[Mapping[str, Any]]:
        """The stateful operator's progress of every micro-batch so far."""
        return [operator for report in self.progress for operator in report["stateOperators"]]
