"""The engine per partition: batch DataFrames run a conversion with ``mapInArrow`` over partitions that
hold each key's rows together and in order, then end the input."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from cdcflow.connectors.spark.changelog.conversion import Conversion
from cdcflow.connectors.spark.changelog.feeding import prepare, run_rows
from cdcflow.core.state import InMemoryStateStore

if TYPE_CHECKING:
    import pyarrow as pa


def partition_function(
    conversion: Conversion, schema: pa.Schema, *, stateful: bool
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """``mapInArrow`` function running the engine over one partition of a batch DataFrame, in order.

    A stateful conversion gets each key's rows together, ordered by ``sequence_by`` (the caller sorts
    the partition); the end of the partition is the end of the input for its keys.
    """

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        now = time.time()  # one processing time for the whole batch: nothing expires within it
        engine = conversion.engine(lambda: now, InMemoryStateStore())
        for batch in batches:
            rows = prepare(conversion, batch.to_pylist(), sort=False, stateful=stateful)
            yield pa.RecordBatch.from_pylist(run_rows(conversion, engine, rows), schema=schema)
        tail = conversion.finish(engine)
        if tail:
            yield pa.RecordBatch.from_pylist(tail, schema=schema)

    return run
