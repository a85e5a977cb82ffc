"""cdcflow's decoding over Spark's own Kafka source: ``decode_kafka(df, format, columns=..., options=...)``.

    raw = spark.readStream.format("kafka").option("kafka.bootstrap.servers", b).option("subscribe", t)
    changes = decode_kafka(raw.load(), "debezium-json", columns="id INT NOT NULL, name STRING")

The DataFrame's Kafka columns (``value``, ``key``, ``topic``, ``partition``, ``offset``, ``timestamp``,
``headers``) go through the executors' decoder of the ``cdc-*`` sources (:class:`BatchDecoder`, in a
``mapInArrow``), so the rows, row kinds, metadata columns, dead letters and counts are theirs. The
options are the sources' decoding options, checked once on the driver; reading Kafka (offsets,
subscriptions, isolation level) is Spark's source's business.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import types as st

from cdcflow.connectors.errors import ConnectorOptionError
from cdcflow.connectors.spark.accounting import range_name
from cdcflow.connectors.spark.decode import BLOCK_SIZE, BatchDecoder
from cdcflow.connectors.spark.options import KAFKA_SOURCE_KEYS
from cdcflow.connectors.spark.read_plan import INFERENCE_SAMPLE, FrameInput, ReadPlan, plan_read
from cdcflow.connectors.spark.worker_process import prepare_worker
from cdcflow.formats.base import Headers, Message
from cdcflow.formats.debezium.arrow import ColumnarDecoder
from cdcflow.formats.types import Schema

KAFKA_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp")
"""The columns of Spark's Kafka source the decoding reads (and ``headers`` when it is there)."""

MAX_BLOCK = 4 * BLOCK_SIZE
"""Spark's Arrow batches (``spark.sql.execution.arrow.maxRecordsPerBatch``, 10,000 records) are decoded
whole up to this many records: a cut into the sources' block size would leave a small block behind."""

_READ_SIDE = {
    "path": "decode_kafka decodes the DataFrame it is given; read files with format('cdc-...').load(path)",
    "maxoffsetspertrigger": "set maxOffsetsPerTrigger on Spark's Kafka source",
    "maxbytespertrigger": "it is a file-replay option of the cdc-* sources",
    "maxrecordsperpartition": "set minPartitions / maxRecordsPerPartition on Spark's Kafka source",
    "minpartitions": "set minPartitions on Spark's Kafka source",
    "topic": "it is a sink option",
    "keycolumns": "it is a sink option",
    "keyordercheck": "it is a sink option",
}


def decode_kafka(
    df: DataFrame,
    format: str = "debezium-json",  # noqa: A002 - the name of the sources' option and of Flink's
    *,
    columns: str | st.StructType | None = None,
    options: Mapping[str, str] | None = None,
) -> DataFrame:
    """The changelog of ``df``'s Kafka records, as ``spark.read[Stream].format("cdc-<format>")`` gives it.

    ``df`` is a batch or streaming DataFrame of ``spark.read[Stream].format("kafka")`` (it needs
    ``value``; ``key``, ``topic``, ``partition``, ``offset``, ``timestamp`` feed the metadata columns,
    dead letters and keyed decoding; ``headers``, from ``includeHeaders=true``, those that read
    headers). ``columns`` are the table columns (DDL or a StructType); without them a batch
    DataFrame's first records are sampled to infer them, as the sources do. ``options`` are the
    sources' decoding options: ``metadata``, ``rowKindColumn``, ``controlEvents``, ``deadLetterPath``,
    ``deadLetterTopic`` (with ``kafka.bootstrap.servers`` and other ``kafka.*`` settings of its
    producer), ``accountingPath``, ``addedColumns`` and the format's own.

    Spark's Kafka source is not part of pyspark: the session needs its jars, or ``format("kafka")``
    fails with "Failed to find data source: kafka". Give ``spark-submit --packages
    org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0`` (the session builder's ``spark.jars.packages``
    alike), or the jars ``scripts/java_deps.sh spark-kafka`` fetches as ``spark.jars``.
    """
    given = dict(options or {})
    if columns is not None:
        if any(key.strip().lower() == "columns" for key in given):
            raise ConnectorOptionError("the table columns are given twice, as columns= and option 'columns'")
        given["columns"] = columns if isinstance(columns, str) else _ddl(columns)
    _check_options(given)
    has_columns = any(key.strip().lower() == "columns" for key in given)
    names = set(df.columns)
    if "value" not in names:
        raise ConnectorOptionError(
            f"decode_kafka needs the 'value' column of Spark's Kafka source; the DataFrame has {df.columns}"
        )
    if not has_columns and df.isStreaming:
        raise ConnectorOptionError(
            "decode_kafka of a streaming DataFrame needs the table columns: pass columns='id INT NOT NULL, "
            "...' (a streaming query's columns are fixed before it reads anything)"
        )
    sample = () if has_columns else _sample(df)
    plan = plan_read(format, given, None, frame=FrameInput(sample))
    _check_columns(plan, names)
    read = [c for c in (*KAFKA_COLUMNS, "headers") if c in names]
    decode = _FrameDecode(plan, tuple(read))
    return df.select(*read).mapInArrow(decode, plan.output)


def _ddl(columns: st.StructType) -> str:
    from cdcflow.connectors.spark.arrow_types import schema_of_struct

    schema: Schema = schema_of_struct(columns)
    return schema.ddl()


def _check_options(given: Mapping[str, str]) -> None:
    lowered = {key.strip().lower(): key for key in given}
    for key, why in _READ_SIDE.items():
        if key in lowered:
            raise ConnectorOptionError(f"decode_kafka does not take option '{lowered[key]}': {why}")
    reading = sorted(lowered[key] for key in lowered if key in KAFKA_SOURCE_KEYS)
    if reading:
        raise ConnectorOptionError(
            f"decode_kafka does not read Kafka, Spark's Kafka source does: set {', '.join(reading)} on "
            "spark.read[Stream].format('kafka')"
        )
    client = sorted(lowered[key] for key in lowered if key.startswith("kafka."))
    if client and "deadlettertopic" not in lowered:
        raise ConnectorOptionError(
            f"decode_kafka takes Kafka settings ({', '.join(client)}) only for the producer of "
            "deadLetterTopic; set the reading ones on spark.read[Stream].format('kafka')"
        )


def _check_columns(plan: ReadPlan, names: set[str]) -> None:
    needed = {"file", "line"} & set(plan.connector_metadata)
    if needed:
        raise ConnectorOptionError(
            f"metadata {', '.join(sorted(needed))} is of recorded files; Kafka records have topic, "
            "partition, offset, timestamp, key and headers"
        )
    missing = sorted(
        {key for key in plan.connector_metadata if key in KAFKA_COLUMNS or key == "headers"} - names
    )
    if plan.include_headers and "headers" not in names and "headers" not in missing:
        missing.append("headers")
    if missing:
        fix = " (set includeHeaders=true on Spark's Kafka source)" if "headers" in missing else ""
        raise ConnectorOptionError(
            f"the decoding needs the Kafka column(s) {', '.join(missing)}, which the DataFrame lacks{fix}"
        )


def _sample(df: DataFrame) -> tuple[Message, ...]:
    """The first records of a batch DataFrame, to infer the columns from (as the sources sample Kafka)."""
    read = [c for c in (*KAFKA_COLUMNS, "headers") if c in df.columns]
    table = df.select(*read).limit(INFERENCE_SAMPLE).toArrow()
    return tuple(m for batch in table.to_batches() for m in _messages(batch))


def _messages(batch: pa.RecordBatch) -> Iterator[Message]:
    """The Kafka records of one Arrow batch of Spark's Kafka source columns."""
    rows = batch.num_rows
    names = batch.schema.names

    def column(name: str) -> list[object]:
        return batch.column(name).to_pylist() if name in names else [None] * rows

    values, keys = column("value"), column("key")
    topics, partitions, offsets = column("topic"), column("partition"), column("offset")
    if "timestamp" in names:
        micros = batch.column("timestamp").cast(pa.int64())
        stamps = pc.divide(micros, 1000).to_pylist()
    else:
        stamps = [None] * rows
    headers = column("headers")
    for index in range(rows):
        pairs = headers[index]
        yield Message(
            values[index],  # type: ignore[arg-type]
            keys[index],  # type: ignore[arg-type]
            topics[index],  # type: ignore[arg-type]
            partitions[index],  # type: ignore[arg-type]
            offsets[index],  # type: ignore[arg-type]
            stamps[index],
            tuple((h["key"], h["value"]) for h in pairs) if pairs else (),  # type: ignore[attr-defined]
        )


@dataclass
class _Bounds:
    """The offsets a task saw per topic partition: its range's name, the same on a retry."""

    seen: dict[tuple[str, int], list[int]] = field(default_factory=dict)

    def add(self, batch: pa.RecordBatch) -> None:
        names = batch.schema.names
        if batch.num_rows == 0 or not {"topic", "partition", "offset"} <= set(names):
            return
        topics, partitions, offsets = (batch.column(c) for c in ("topic", "partition", "offset"))
        first = pc.min_max(partitions).as_py()
        if first["min"] == first["max"] and pc.all(pc.equal(topics, topics[0])).as_py():
            span = pc.min_max(offsets).as_py()  # one topic partition: what Spark's source gives a task
            self._widen(topics[0].as_py(), first["min"], span["min"], span["max"])
            return
        keys = pa.Table.from_batches([batch.select(["topic", "partition", "offset"])])
        grouped = keys.group_by(["topic", "partition"]).aggregate([("offset", "min"), ("offset", "max")])
        columns = (grouped.column(c).to_pylist() for c in ("topic", "partition", "offset_min", "offset_max"))
        for topic, partition, low, high in zip(*columns, strict=True):
            self._widen(topic, partition, low, high)

    def _widen(self, topic: str, partition: int, low: int, high: int) -> None:
        bounds = self.seen.setdefault((topic, partition), [low, high])
        bounds[0], bounds[1] = min(bounds[0], low), max(bounds[1], high)

    def name(self) -> str | None:
        if not self.seen:
            return None
        ranges = sorted((t, p, low, high + 1) for (t, p), (low, high) in self.seen.items())
        first = range_name(*ranges[0])
        if len(ranges) == 1:
            return first
        digest = hashlib.sha256(repr(ranges).encode()).hexdigest()[:12]
        return f"{first}-and-{len(ranges) - 1}-more-{digest}"


class _FrameDecoder(BatchDecoder):
    """The sources' decoder over Arrow batches of Kafka records: a block the columnar path takes keeps
    its metadata columns in Arrow (taken from the Kafka columns), any other is decoded message by
    message, as the sources do."""

    def name_range(self, name: str) -> None:
        """Name the range once its bounds are known (a task sees its offsets only as it reads them),
        before it is committed: a retried task or a re-evaluated DataFrame replaces its dead letters."""
        self.range_name = name
        if self._dead_letters is not None:
            self._dead_letters.range_name = name

    def record_batches(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        bounds = _Bounds()
        with self._range():
            for batch in batches:
                bounds.add(batch)
                for start in range(0, batch.num_rows, MAX_BLOCK):
                    decoded = self._decode_records(batch.slice(start, MAX_BLOCK))
                    if decoded is not None and decoded.num_rows:
                        yield decoded
            name = bounds.name()
            if name is not None:
                self.name_range(name)

    def _decode_records(self, block: pa.RecordBatch) -> pa.RecordBatch | None:
        columnar = self._columnar
        if columnar is not None:
            keys = block.column("key") if columnar.keyed_state and _has_keys(block) else None
            result = columnar.decode_array(block.column("value"), keys, _headers(block, columnar))
            if result is not None:
                self._count_columnar(result, messages=block.num_rows)
                columns = self._data_columns(result.rows)
                for key in self.plan.connector_metadata:
                    arrow_type = self.target.field(key).type
                    columns[key] = _metadata(block, key).take(result.message_index).cast(arrow_type)
                return pa.RecordBatch.from_arrays([columns[f.name] for f in self.target], schema=self.target)
        return self._decode_block(list(_messages(block)), columnar=False)


def _headers(block: pa.RecordBatch, columnar: ColumnarDecoder) -> list[Headers] | None:
    """The records' headers, when the decoder reads keys from them (Debezium's primary-key changes)."""
    if not columnar.reads_headers or "headers" not in block.schema.names:
        return None
    return [
        tuple((h["key"], h["value"]) for h in pairs) if pairs else ()
        for pairs in block.column("headers").to_pylist()
    ]


def _has_keys(block: pa.RecordBatch) -> bool:
    return "key" in block.schema.names and block.column("key").null_count < block.num_rows


def _metadata(block: pa.RecordBatch, key: str) -> pa.Array:
    """A metadata column from Spark's Kafka columns, as the sources give it (no headers: null)."""
    column = block.column(key)
    if key == "headers":
        empty = pc.equal(pc.list_value_length(column), 0)
        return pc.if_else(empty, pa.nulls(len(column), column.type), column)
    return column


class _FrameDecode:
    """The function ``mapInArrow`` runs on each task: Arrow batches of Kafka records → changelog batches."""

    def __init__(self, plan: ReadPlan, read: tuple[str, ...]) -> None:
        self.plan = plan
        self.read = read

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        prepare_worker()
        return _FrameDecoder(self.plan).record_batches(batches)
