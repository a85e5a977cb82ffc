"""``fill_unavailable``: values a change does not carry, filled from the key's last image in Spark's state.

A Debezium source read with ``unavailable-values=REPORT`` and metadata ``unavailable-columns`` names,
in each row, the columns Debezium did not send (unchanged TOASTed values): they are NULL there. This
operator keeps each key's last image in a ``ValueState`` of ``transformWithState`` (checkpointed: it
survives micro-batches, task boundaries and restarts) and fills those columns from it, removing them
from the row's list. A column it cannot fill (no earlier image of the key) stays NULL and named.

    changes = spark.readStream.format("cdc-debezium").option("unavailable-values", "report")
        .option("metadata", "unavailable-columns,source.sequence")...load()
    filled = fill_unavailable(changes, key=["id"], sequence_by=["source_sequence"])

Not covered: a primary-key change (the new key's first image has no earlier image under that key; the
Delta applier carries it with ``old-key``), and a truncate does not clear the images (rows after it
start with an insert, which carries every value). Control event rows (null row kind) pass unchanged.
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql import Row
from pyspark.sql import types as st
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle, TimerValues

from cdcflow.connectors.errors import ConnectorOptionError
from cdcflow.connectors.spark.arrow_types import arrow_schema
from cdcflow.connectors.spark.session import require_stateful_setup

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

Record = dict[str, Any]
Image = dict[str, Any]
_STATE = st.StructType([st.StructField("image", st.BinaryType(), False)])


@dataclass(frozen=True)
class Filler:
    """The per-key step, shared by the streaming processor and the batch path."""

    key: tuple[str, ...]
    sequence_by: tuple[str, ...]
    unavailable_column: str
    row_kind_column: str

    def ordered(self, records: list[Record]) -> list[Record]:
        for record in records:
            if record[self.row_kind_column] is not None and any(record[c] is None for c in self.sequence_by):
                raise ConnectorOptionError(
                    f"key {[record[c] for c in self.key]}: sequence_by {list(self.sequence_by)} is NULL; "
                    "fill_unavailable orders each key's changes by it"
                )
        # Control events may have no position: they go last (their row passes through unchanged).
        return sorted(
            records, key=lambda r: tuple((0, r[c]) if r[c] is not None else (1,) for c in self.sequence_by)
        )

    def apply(self, record: Record, image: Image | None) -> Image | None:
        """Fill ``record`` in place from ``image``; the key's image after it."""
        kind = record[self.row_kind_column]
        if kind is None:
            return image  # a control event
        missing = record[self.unavailable_column] or []
        if missing and image is not None:
            remaining = []
            for name in missing:
                if name in image:
                    record[name] = image[name]
                else:
                    remaining.append(name)
            record[self.unavailable_column] = remaining
            missing = remaining
        if kind == "-D":
            return None
        if kind == "-U":
            return image
        skip = {self.row_kind_column, self.unavailable_column, *missing}
        return {**(image or {}), **{k: v for k, v in record.items() if k not in skip}}


class FillProcessor(StatefulProcessor):
    def __init__(self, filler: Filler, state_name: str) -> None:
        self.filler = filler
        self.state_name = state_name

    def init(self, handle: StatefulProcessorHandle) -> None:
        self._value = handle.getValueState(self.state_name, _STATE)

    def handleInputRows(self, key: Any, rows: Any, timerValues: TimerValues) -> Iterator[Row]:
        stored = self._value.get()
        image: Image | None = pickle.loads(stored[0]) if stored is not None else None  # noqa: S301 - ours
        records = self.filler.ordered([row.asDict() for row in rows])
        for record in records:
            image = self.filler.apply(record, image)
        if image is None:
            self._value.clear()
        else:
            self._value.update((pickle.dumps(image, 5),))
        return iter([Row(**record) for record in records])

    def close(self) -> None:
        pass


def _batch_function(filler: Filler, schema: pa.Schema) -> Any:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        images: dict[tuple[Any, ...], Image | None] = {}
        for batch in batches:
            records = batch.to_pylist()
            for record in records:
                key = tuple(record[c] for c in filler.key)
                images[key] = filler.apply(record, images.get(key))
            yield pa.RecordBatch.from_pylist(records, schema=schema)

    return run


def fill_unavailable(
    df: DataFrame,
    key: Sequence[str],
    *,
    sequence_by: Sequence[str],
    unavailable_column: str = "unavailable_columns",
    row_kind_column: str = "_row_kind",
    uid: str | None = None,
) -> DataFrame:
    """``df`` with each row's unavailable columns filled from its key's last image (see the module).

    ``sequence_by`` orders each key's changes (``source_sequence``, or the Kafka ``partition`` and
    ``offset`` of a topic keyed by primary key); ``uid`` names the state, so that a changed query
    keeps it.
    """
    names = set(df.columns)
    wanted = [*key, *sequence_by, unavailable_column, row_kind_column]
    missing = [name for name in wanted if name not in names]
    if missing or not key or not sequence_by:
        raise ConnectorOptionError(
            f"fill_unavailable needs key and sequence_by columns, '{unavailable_column}' (metadata "
            f"unavailable-columns) and '{row_kind_column}'; missing: {missing or 'key / sequence_by'}"
        )
    filler = Filler(tuple(key), tuple(sequence_by), unavailable_column, row_kind_column)
    if not df.isStreaming:
        arranged = df.repartition(*key).sortWithinPartitions(*key, *sequence_by)
        return arranged.mapInArrow(_batch_function(filler, arrow_schema(df.schema)), df.schema)
    require_stateful_setup(df.sparkSession)
    state = "unavailable" if uid is None else "unavailable_" + re.sub(r"[^0-9A-Za-z_]", "_", uid)
    processor = FillProcessor(filler, state)
    return df.groupBy(*key).transformWithState(processor, df.schema, "Append", "None")
