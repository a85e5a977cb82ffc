"""``decode_kafka`` over Spark's own Kafka source (``format("kafka")``, spark-sql-kafka jars) gives the
same changelog as the ``cdc-*`` sources reading the same topics: rows, row kinds, metadata columns,
dead letters (once, with the original bytes) and counts; batch and streaming (availableNow)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import orjson
import pytest
from kafka_fixture import KafkaCluster, unique_topic
from pyspark.sql import DataFrame, SparkSession
from source_cases import (
    EXCLUDE,
    GOLDEN_ROWS,
    INCLUDE,
    KAFKA_METADATA,
    PARTITIONS,
    PRODUCTS,
    SCHEMA,
    T0_MS,
    ProductsTopic,
    debezium,
    expected_rows,
    observed,
    render,
    rendered,
    with_offsets,
)

from cdcflow.connectors.errors import ConnectorOptionError
from cdcflow.connectors.kafka import producer as kafka_producer
from cdcflow.connectors.spark.accounting import read_counts
from cdcflow.connectors.spark.arrow_types import arrow_schema, struct_type
from cdcflow.connectors.spark.dead_letters import read_dead_letters
from cdcflow.connectors.spark.read_plan import FrameInput, plan_read
from cdcflow.formats import DecodeOutput, Message, render_change, resolve_format
from cdcflow.formats.debezium.arrow import ColumnarDecoder
from cdcflow.spark import decode_kafka

pytestmark = pytest.mark.integration


def kafka(spark: SparkSession, bootstrap: str, topic: str, **options: str) -> DataFrame:
    """A batch read of ``topic`` with Spark's own Kafka source, committed records only."""
    return (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("kafka.isolation.level", "read_committed")
        .options(**options)
        .load()
    )


def test_batch_decode_equals_the_cdc_source_with_metadata_keys_and_headers(
    spark: SparkSession, products: ProductsTopic
) -> None:
    metadata = f"source.table,{KAFKA_METADATA}"
    raw = kafka(spark, products.bootstrap, products.name, includeHeaders="true")
    decoded = decode_kafka(raw, "debezium-json", columns=PRODUCTS, options={"metadata": metadata})
    source = products.reader(spark).option("subscribe", products.name).option("metadata", metadata).load()
    assert decoded.schema == source.schema
    want = expected_rows(products.messages)
    assert {r[1] for r in want} == {0, 1} and any(r[5] for r in want) and all(r[4] for r in want)
    assert observed(decoded) == want
    assert observed(source) == want
    kinds = sorted(r["_row_kind"] for r in decoded.toArrow().to_pylist())
    assert kinds == sorted(line[:2] for line in GOLDEN_ROWS)


def test_unchanged_toast_values_fill_per_key_on_both_kafka_paths_as_per_record(
    spark: SparkSession, kafka_cluster: KafkaCluster
) -> None:
    """The default ``unavailable-values=fill`` on a keyed topic of two partitions (placeholders in after
    and before images, deletes, tombstones, re-inserts, keyless records), read by ``cdc-debezium`` and
    by ``decode_kafka``: each task's columnar blocks fill from their key state as the per-record decoder
    does, record by record."""
    from test_columnar import keyed_stream

    topic = unique_topic("keyed-fill")
    kafka_cluster.create_topic(topic, PARTITIONS)
    messages = []
    # past one block (8,192 records) per partition: later blocks fill from the key state of earlier ones
    for index, (key, value) in enumerate(keyed_stream(5, 20_000)):
        if key is not None:
            row_id = orjson.loads(key)["id"]
        elif value is not None:
            envelope = orjson.loads(value)
            row_id = (envelope["after"] or envelope["before"])["id"]
        else:
            row_id = 0  # a keyless tombstone: no row, no state
        messages.append(Message(value, key, None, row_id % PARTITIONS, None, T0_MS + index, ()))
    kafka_producer.produce_messages(kafka_cluster.bootstrap_servers, messages, topic)
    placed = with_offsets(messages, topic)
    decoder, out, want = resolve_format("debezium-json").create_decoder({}, SCHEMA), DecodeOutput(), []
    for m in placed:
        before = len(out.changes)
        decoder.decode(m, out)
        want += [(m.partition, m.offset, render_change(c, SCHEMA)) for c in out.changes[before:]]
    want.sort()
    assert out.metrics.filled_values > 50 and out.metrics.unavailable_values > 10, out.metrics
    raw = kafka(spark, kafka_cluster.bootstrap_servers, topic)
    decoded = decode_kafka(raw, "debezium-json", columns=PRODUCTS, options={"metadata": "partition,offset"})
    source = (
        debezium(spark)
        .option("kafka.bootstrap.servers", kafka_cluster.bootstrap_servers)
        .option("subscribe", topic)
        .option("metadata", "partition,offset")
        .load()
    )
    for read in (decoded, source):
        got = sorted((r["partition"], r["offset"], render(r)) for r in read.toArrow().to_pylist())
        assert got == want


def test_the_columnar_path_keeps_the_kafka_metadata_of_each_row(
    spark: SparkSession, products: ProductsTopic
) -> None:
    """With unavailable-values=report the blocks take the columnar path, whose metadata columns come
    straight from Spark's Kafka columns: they must equal the source's, row for row."""
    options = {"metadata": KAFKA_METADATA, "debezium-json.unavailable-values": "report"}
    raw = kafka(spark, products.bootstrap, products.name, includeHeaders="true")
    decoded = decode_kafka(raw, columns=PRODUCTS, options=options)
    plan = plan_read("debezium-json", {**options, "columns": PRODUCTS}, None, frame=FrameInput())
    assert (
        ColumnarDecoder.for_decoder(plan.decoder, arrow_schema(struct_type(plan.decoded_columns))) is not None
    )
    source = products.reader(spark).option("subscribe", products.name).options(**options).load()
    assert decoded.schema == source.schema

    def rows(df: DataFrame) -> list[tuple[Any, ...]]:
        got = df.toArrow().to_pylist()
        return sorted(
            (r["partition"], r["offset"], r["timestamp"], r["key"], r["headers"], render(r)) for r in got
        )

    want = [(r[1], r[2], r[3], r[4], r[5], r[7]) for r in expected_rows(products.messages)]
    assert rows(decoded) == sorted(want)
    assert rows(source) == sorted(want)
    assert {r["topic"] for r in decoded.toArrow().to_pylist()} == {products.name}


def test_columns_are_inferred_from_a_batch_dataframe_as_the_source_infers_them(
    spark: SparkSession, kafka_cluster: KafkaCluster, products: ProductsTopic
) -> None:
    topic = unique_topic("decode-infer")
    kafka_cluster.create_topic(topic, 1)
    lines = INCLUDE.read_bytes().splitlines()
    kafka_producer.produce_messages(products.bootstrap, [Message(v, partition=0) for v in lines], topic)
    options = {"debezium-json.schema-include": "true", "metadata": "partition,offset"}
    decoded = decode_kafka(kafka(spark, products.bootstrap, topic), options=options)
    source = (
        spark.read.format("cdc-debezium")
        .option("kafka.bootstrap.servers", products.bootstrap)
        .option("subscribe", topic)
        .options(**options)
        .load()
    )
    assert decoded.schema == source.schema
    assert decoded.columns == ["id", "name", "description", "weight", "partition", "offset", "_row_kind"]

    def rows(df: DataFrame) -> list[tuple[Any, ...]]:
        return sorted(tuple(r.values()) for r in df.toArrow().to_pylist())

    assert rows(decoded) == rows(source)
    assert len(rows(decoded)) == len(GOLDEN_ROWS)
    with pytest.raises(ConnectorOptionError, match="needs the table schema"):
        decode_kafka(kafka(spark, products.bootstrap, topic), options={"metadata": "offset"})


def test_streaming_available_now_over_several_micro_batches_equals_the_batch_source(
    spark: SparkSession, kafka_cluster: KafkaCluster, products: ProductsTopic, tmp_path: Path
) -> None:
    topic, limit = unique_topic("decode-stream"), 6
    kafka_cluster.create_topic(topic, 3)
    lines = EXCLUDE.read_bytes().splitlines()
    kafka_producer.produce_messages(
        products.bootstrap,
        [Message(line, orjson.dumps({"n": i}), partition=i % 3) for i, line in enumerate(lines)],
        topic,
    )
    raw = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", products.bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(limit))
        .option("kafka.isolation.level", "read_committed")
        .load()
    )
    changes = decode_kafka(raw, columns=PRODUCTS, options={"metadata": "topic,partition,offset,key"})
    assert changes.isStreaming
    batches: list[list[dict[str, Any]]] = []

    def collect(batch: DataFrame, _: int) -> None:
        batches.append(batch.toArrow().to_pylist())

    query = (
        changes.writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    assert query.exception() is None
    assert len([b for b in batches if b]) >= len(lines) // limit >= 2
    assert all(len({(r["partition"], r["offset"]) for r in b}) <= limit for b in batches)
    source = (
        products.reader(spark)
        .option("subscribe", topic)
        .option("metadata", "topic,partition,offset,key")
        .load()
    )

    def keyed(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return sorted(
            (r["partition"], r["offset"], r["key"], r["_row_kind"], r["id"], r["weight"]) for r in rows
        )

    streamed = [r for b in batches for r in b]
    assert keyed(streamed) == keyed(source.toArrow().to_pylist())
    assert sorted(rendered(changes_of(streamed))) == sorted(GOLDEN_ROWS)


def changes_of(rows: list[dict[str, Any]]) -> Any:
    """Rows as ``rendered`` takes them (it calls ``toArrow``)."""

    class Rows:
        def toArrow(self) -> Any:  # noqa: N802 - DataFrame's name
            import pyarrow as pa

            return pa.Table.from_pylist(rows)

    return Rows()


def test_a_poisoned_record_is_a_dead_letter_once_with_its_original_bytes(
    spark: SparkSession, kafka_cluster: KafkaCluster, products: ProductsTopic, tmp_path: Path
) -> None:
    topic = unique_topic("decode-poison")
    kafka_cluster.create_topic(topic, 2)
    good = EXCLUDE.read_bytes().splitlines()[:4]
    poison = b'{"before":null,"after":{"id":1'
    records = [
        Message(good[0], b"k0", partition=0),
        Message(poison, b"bad-key", partition=0, headers=(("h", b"v"),)),
        Message(good[1], b"k1", partition=0),
        Message(good[2], b"k2", partition=1),
        Message(good[3], b"k3", partition=1),
    ]
    kafka_producer.produce_messages(products.bootstrap, records, topic)
    frame, source = tmp_path / "frame", tmp_path / "source"
    options = {"deadLetterPath": str(frame / "dead"), "accountingPath": str(frame / "counts")}
    raw = kafka(spark, products.bootstrap, topic, includeHeaders="true")
    decoded = decode_kafka(raw, columns=PRODUCTS, options=options)
    for _ in range(2):  # a second evaluation reads the same ranges: it replaces, never adds
        assert sorted(rendered(decoded)) == sorted(GOLDEN_ROWS[:4])
    cdc = (
        products.reader(spark)
        .option("subscribe", topic)
        .option("deadLetterPath", str(source / "dead"))
        .option("accountingPath", str(source / "counts"))
        .load()
    )
    assert sorted(rendered(cdc)) == sorted(GOLDEN_ROWS[:4])
    letters = read_dead_letters(str(frame / "dead"))
    assert len(letters) == 1
    letter = letters[0]
    assert base64.b64decode(letter["value"]) == poison
    assert base64.b64decode(letter["key"]) == b"bad-key"
    assert letter["headers"] == [["h", base64.b64encode(b"v").decode()]]
    assert (letter["topic"], letter["partition"], letter["offset"]) == (topic, 0, 1)
    assert letter["origin"] == f"topic '{topic}' partition 0 offset 1"
    assert letters == read_dead_letters(str(source / "dead"))
    counts = read_counts(str(frame / "counts"))
    assert (counts.read, counts.dead_letters, counts.changed) == (5, 1, 4)
    assert counts == read_counts(str(source / "counts"))


def test_old_key_reads_the_debezium_header_and_needs_include_headers(
    spark: SparkSession, kafka_cluster: KafkaCluster, products: ProductsTopic
) -> None:
    topic = unique_topic("decode-oldkey")
    kafka_cluster.create_topic(topic, 1)
    columns = "id INT NOT NULL, name STRING"
    create = orjson.dumps({"op": "c", "before": None, "after": {"id": 2, "name": "moved"}})
    old_key = orjson.dumps({"id": 1})
    kafka_producer.produce_messages(
        products.bootstrap,
        [Message(create, orjson.dumps({"id": 2}), partition=0, headers=(("__debezium.oldkey", old_key),))],
        topic,
    )
    options = {"metadata": "old-key"}
    decoded = decode_kafka(
        kafka(spark, products.bootstrap, topic, includeHeaders="true"), columns=columns, options=options
    )
    source = (
        spark.read.format("cdc-debezium")
        .option("kafka.bootstrap.servers", products.bootstrap)
        .option("subscribe", topic)
        .option("columns", columns)
        .option("metadata", "old-key")
        .load()
    )
    assert decoded.toArrow().to_pylist() == source.toArrow().to_pylist()
    assert decoded.toArrow().to_pylist() == [
        {"id": 2, "name": "moved", "old_key": '{"id":1}', "_row_kind": "+I"}
    ]
    with pytest.raises(ConnectorOptionError, match="includeHeaders=true"):
        decode_kafka(kafka(spark, products.bootstrap, topic), columns=columns, options=options)


def test_upsert_kafka_tombstone_is_a_delete_as_the_source_reads_it(
    spark: SparkSession, kafka_cluster: KafkaCluster, products: ProductsTopic
) -> None:
    topic = unique_topic("decode-upsert")
    kafka_cluster.create_topic(topic, 1)

    def record(key: int, value: dict[str, Any] | None) -> Message:
        return Message(None if value is None else orjson.dumps(value), orjson.dumps({"id": key}), partition=0)

    kafka_producer.produce_messages(
        products.bootstrap,
        [
            record(1, {"id": 1, "name": "scooter"}),
            record(2, {"id": 2, "name": "hammer"}),
            record(1, {"id": 1, "name": "scooter v2"}),
            record(2, None),
        ],
        topic,
    )
    options = {"key.fields": "id", "metadata": "offset"}
    columns = "id INT NOT NULL, name STRING"
    decoded = decode_kafka(
        kafka(spark, products.bootstrap, topic), "upsert-kafka", columns=columns, options=options
    )
    got = [(r["offset"], r["_row_kind"], r["id"], r["name"]) for r in decoded.toArrow().to_pylist()]
    assert got == [
        (0, "+U", 1, "scooter"),
        (1, "+U", 2, "hammer"),
        (2, "+U", 1, "scooter v2"),
        (3, "-D", 2, None),
    ]


def test_canal_json_equals_the_cdc_canal_source(
    spark: SparkSession, kafka_cluster: KafkaCluster, products: ProductsTopic
) -> None:
    topic = unique_topic("decode-canal")
    kafka_cluster.create_topic(topic, 1)
    canal = [
        {"data": [{"id": "1", "name": "a"}, {"id": "2", "name": "b"}], "old": None, "type": "INSERT",
         "database": "db", "table": "t", "es": 1, "ts": 2, "isDdl": False},
        {"data": [{"id": "1", "name": "a2"}], "old": [{"name": "a"}], "type": "UPDATE",
         "database": "db", "table": "t", "es": 3, "ts": 4, "isDdl": False},
        {"data": [{"id": "2", "name": "b"}], "old": None, "type": "DELETE",
         "database": "db", "table": "t", "es": 5, "ts": 6, "isDdl": False},
    ]  # fmt: skip
    kafka_producer.produce_messages(
        products.bootstrap, [Message(orjson.dumps(e), partition=0) for e in canal], topic
    )
    columns, options = "id INT NOT NULL, name STRING", {"metadata": "table,offset"}
    decoded = decode_kafka(
        kafka(spark, products.bootstrap, topic), "canal-json", columns=columns, options=options
    )
    source = (
        spark.read.format("cdc-canal")
        .option("kafka.bootstrap.servers", products.bootstrap)
        .option("subscribe", topic)
        .option("columns", columns)
        .options(**options)
        .load()
    )
    got = decoded.toArrow().to_pylist()
    assert got == source.toArrow().to_pylist()
    assert [(r["offset"], r["_row_kind"], r["id"], r["name"]) for r in got] == [
        (0, "+I", 1, "a"),
        (0, "+I", 2, "b"),
        (1, "-U", 1, "a"),
        (1, "+U", 1, "a2"),
        (2, "-D", 2, "b"),
    ]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": "t"}, "Spark's Kafka source does: set subscribe"),
        ({"kafka.bootstrap.servers": "b:9092"}, "only for the producer of deadLetterTopic"),
        ({"maxOffsetsPerTrigger": "5"}, "set maxOffsetsPerTrigger on Spark's Kafka source"),
        ({"metadata": "line"}, "metadata line is of recorded files"),
        ({"debezium-json.ignore-parse-errors": "true"}, "set deadLetterPath"),
        ({"nonsense": "1"}, "Unsupported options for format 'debezium-json': nonsense"),
    ],
)
def test_options_are_checked_on_the_driver(
    spark: SparkSession, products: ProductsTopic, options: dict[str, str], message: str
) -> None:
    raw = kafka(spark, products.bootstrap, products.name)
    with pytest.raises(ConnectorOptionError, match=message):
        decode_kafka(raw, columns=PRODUCTS, options=options)


def test_a_streaming_dataframe_needs_the_columns(spark: SparkSession, products: ProductsTopic) -> None:
    raw = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", products.bootstrap)
        .option("subscribe", products.name)
        .load()
    )
    with pytest.raises(ConnectorOptionError, match="streaming DataFrame needs the table columns"):
        decode_kafka(raw)
