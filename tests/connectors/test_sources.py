"""The ``cdc-*`` sources as a Spark user meets them: options and their errors, inferred columns,
metadata columns, dead letters, replayed topic dumps and directories, and the Kafka source options."""

from __future__ import annotations

import base64
import datetime as dt
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from golden_cases import GOLDEN, TESTDATA, load
from kafka_fixture import KafkaCluster, unique_topic
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, DataFrameReader, SparkSession
from pyspark.sql import types as st

from cdcflow.connectors import kafka_client
from cdcflow.connectors.dead_letters import read_dead_letters
from cdcflow.connectors.errors import ConnectorOptionError
from cdcflow.connectors.kafka_options import KafkaOptions, OffsetRange, TopicPartition
from cdcflow.connectors.read_plan import plan_read
from cdcflow.connectors.readers import CdcStreamReader
from cdcflow.connectors.replay import record_topic
from cdcflow.core.model import Change
from cdcflow.core.rowkind import RowKind
from cdcflow.formats import Message, parse_ddl, render_change, resolve_format

pytestmark = pytest.mark.integration

PRODUCTS = "id INT NOT NULL, name STRING, description STRING, weight FLOAT"
SCHEMA = parse_ddl(PRODUCTS)
EXCLUDE = TESTDATA / "flink" / "debezium-data-schema-exclude.txt"
INCLUDE = TESTDATA / "flink" / "debezium-data-schema-include.txt"
GOLDEN_ROWS = load(GOLDEN / "flink-debezium-data-schema-exclude.golden").rows
LINE_OF_ROW = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 10, 11, 11, 12, 13, 14, 14, 15, 15, 16]
"""The line of EXCLUDE each golden row comes from: an update gives -U and +U from one line."""
KAFKA_METADATA = "topic,partition,offset,timestamp,key,headers"
PARTITIONS = 2
T0_MS = 1_700_000_000_000

Observed = tuple[Any, ...]


def rendered(df: DataFrame, row_kind: str = "_row_kind") -> list[str]:
    return [render(row, row_kind) for row in df.toArrow().to_pylist()]


def render(row: dict[str, Any], row_kind: str = "_row_kind") -> str:
    kind = RowKind.from_short_string(row[row_kind])
    return render_change(Change(kind, {f.name: row[f.name] for f in SCHEMA}), SCHEMA)


def analysis_error(action: Callable[[], object]) -> str:
    """The text of the AnalysisException Spark raises on the driver when a source refuses its options."""
    with pytest.raises(AnalysisException) as failure:
        action()
    return str(failure.value)


def debezium(spark: SparkSession) -> DataFrameReader:
    return spark.read.format("cdc-debezium").option("columns", PRODUCTS)


# --- options ------------------------------------------------------------------------------------


def test_unknown_option_lists_the_valid_ones(spark: SparkSession) -> None:
    text = analysis_error(
        lambda: spark.read.format("cdc-debezium").option("schemaInclude", "true").load(str(EXCLUDE))
    )
    # Spark hands the options over with lower-cased keys.
    assert "ConnectorOptionError: Unsupported options for format 'debezium-json': schemainclude." in text
    for valid in ("columns", "deadLetterPath", "subscribePattern", "kafka.*", "debezium-json.schema-include"):
        assert valid in text


def test_ignore_parse_errors_needs_a_dead_letter_target(spark: SparkSession) -> None:
    text = analysis_error(
        lambda: debezium(spark).option("ignore-parse-errors", "true").load(str(EXCLUDE)).collect()
    )
    assert "'debezium-json.ignore-parse-errors' is true but rejected records need somewhere to go" in text
    assert "set deadLetterPath (a directory) or deadLetterTopic" in text


def test_unknown_metadata_key_lists_the_available_ones(spark: SparkSession) -> None:
    text = analysis_error(lambda: debezium(spark).option("metadata", "line,table").load(str(EXCLUDE)))
    assert (
        "unknown metadata column 'table'; available: topic, partition, offset, timestamp, key, headers"
        in text
    )
    assert "line; format 'debezium-json' adds ingestion-timestamp, op, schema, source.database" in text


def test_schema_without_the_row_kind_column_says_how_to_fix_it(spark: SparkSession) -> None:
    text = analysis_error(
        lambda: spark.read.format("cdc-debezium").schema(PRODUCTS).load(str(EXCLUDE)).collect()
    )
    assert "has no '_row_kind' column for the row kind: add `_row_kind STRING NOT NULL` to it" in text
    assert ".option('columns', '<DDL>')" in text


def test_schema_with_the_row_kind_and_metadata_columns_reads_like_option_columns(spark: SparkSession) -> None:
    df = (
        spark.read.format("cdc-debezium")
        .schema(f"{PRODUCTS}, line BIGINT, _row_kind STRING NOT NULL")
        .option("metadata", "line")
        .load(str(EXCLUDE))
    )
    rows = df.toArrow().to_pylist()
    assert df.columns == ["id", "name", "description", "weight", "line", "_row_kind"]
    assert [render(row) for row in rows] == GOLDEN_ROWS
    assert [row["line"] for row in rows] == LINE_OF_ROW


def test_row_kind_column_option_renames_it(spark: SparkSession) -> None:
    df = debezium(spark).option("rowKindColumn", "op_kind").load(str(EXCLUDE))
    assert df.columns == ["id", "name", "description", "weight", "op_kind"]
    assert df.schema["op_kind"] == st.StructField("op_kind", st.StringType(), False)
    assert rendered(df, "op_kind") == GOLDEN_ROWS


# --- inferred columns ---------------------------------------------------------------------------


INCLUDE_ROWS = load(GOLDEN / "flink-debezium-data-schema-include-double.golden").rows


@pytest.mark.parametrize(
    "key", ["schema-include", "debezium-json.schema-include", "DEBEZIUM-JSON.Schema-Include"]
)
def test_schema_include_infers_the_columns_with_or_without_the_format_prefix(
    spark: SparkSession, key: str
) -> None:
    df = (
        spark.read.format("cdc-debezium")
        .option(key, "true")
        .option("metadata", "source.table")
        .load(str(INCLUDE))
    )
    # What the Kafka Connect schema block declares: int32, string (optional false), string, double.
    assert df.schema == st.StructType(
        [
            st.StructField("id", st.IntegerType(), False),
            st.StructField("name", st.StringType(), False),
            st.StructField("description", st.StringType(), True),
            st.StructField("weight", st.DoubleType(), True),
            st.StructField("source_table", st.StringType(), True),
            st.StructField("_row_kind", st.StringType(), False),
        ]
    )
    rows = df.toArrow().to_pylist()
    schema = parse_ddl("id INT NOT NULL, name STRING, description STRING, weight DOUBLE")
    got = [render_change(Change(RowKind.from_short_string(r["_row_kind"]), r), schema) for r in rows]
    assert got == INCLUDE_ROWS
    assert {row["source_table"] for row in rows} == {"products"}


# --- dead letters -------------------------------------------------------------------------------


def test_bad_line_goes_to_the_dead_letter_path_with_its_bytes(spark: SparkSession, tmp_path: Path) -> None:
    lines = EXCLUDE.read_bytes().splitlines()
    bad = b'{"before":null,"after":{"id":"not a number"},"op":"c"}'
    source = tmp_path / "events.txt"
    source.write_bytes(b"\n".join([lines[0], bad, b"{oops", lines[1]]) + b"\n")
    dead = tmp_path / "dead"
    df = debezium(spark).option("deadLetterPath", str(dead)).load(str(source))
    assert rendered(df) == GOLDEN_ROWS[:2]
    letters = sorted(read_dead_letters(str(dead)), key=lambda r: r["line"])
    assert [(r["file"], r["line"], base64.b64decode(r["value"])) for r in letters] == [
        (str(source), 2, bad),
        (str(source), 3, b"{oops"),
    ]
    assert [r["origin"] for r in letters] == [f"{source}:2", f"{source}:3"]
    assert [(r["format"], r["field"], r["reason"]) for r in letters] == [
        ("debezium-json", "after.id", "expected an integer for INT, got 'not a number'"),
        (
            "debezium-json",
            None,
            "not valid JSON (unexpected character, expected a string key at character 1)",
        ),
    ]


# --- a Kafka topic of Debezium events, with keys, headers, timestamps and a tombstone -------------


def product_messages() -> list[Message]:
    """The Flink test events keyed by id over two partitions, every other one with headers, and the
    tombstone Debezium writes after a delete."""
    messages = []
    for index, line in enumerate(EXCLUDE.read_bytes().splitlines()):
        envelope = orjson.loads(line)
        row = envelope["after"] or envelope["before"]
        key = orjson.dumps({"id": row["id"]})
        headers = [("trace", f"t{index}".encode()), ("empty", None)] if index % 2 else []
        partition = row["id"] % PARTITIONS
        messages.append(Message(line, key, None, partition, None, T0_MS + index * 1000, tuple(headers)))
        if envelope["op"] == "d":
            messages.append(Message(None, key, None, partition, None, T0_MS + index * 1000 + 1, ()))
    return messages


def with_offsets(messages: list[Message], topic: str) -> list[Message]:
    """The messages as Kafka holds them: offsets counted per partition."""
    counts = dict.fromkeys(range(PARTITIONS), 0)
    placed = []
    for m in messages:
        assert m.partition is not None
        offset = counts[m.partition]
        counts[m.partition] += 1
        placed.append(Message(m.value, m.key, topic, m.partition, offset, m.timestamp_ms, m.headers))
    return placed


def expected_rows(messages: list[Message]) -> list[Observed]:
    """What the per-message decoder makes of each record, with the record's coordinates."""
    decoder = resolve_format("debezium-json").create_decoder({}, SCHEMA, ["source.table"])
    out: list[Observed] = []
    for m in messages:
        for change in decoder.decode_all([m]).changes:
            headers = [{"key": k, "value": v} for k, v in m.headers] or None
            assert m.timestamp_ms is not None
            timestamp = dt.datetime.fromtimestamp(m.timestamp_ms / 1000, dt.UTC)
            table = change.row["source_table"]
            out.append(
                (
                    m.topic,
                    m.partition,
                    m.offset,
                    timestamp,
                    m.key,
                    headers,
                    table,
                    render_change(change, SCHEMA),
                )
            )
    return sorted(out, key=lambda item: item[:3])


def observed(df: DataFrame) -> list[Observed]:
    out = [
        (
            r["topic"],
            r["partition"],
            r["offset"],
            r["timestamp"],
            r["key"],
            r["headers"],
            r["source_table"],
            render(r),
        )
        for r in df.toArrow().to_pylist()
    ]
    return sorted(out, key=lambda item: item[:3])  # stable: -U stays before +U


class ProductsTopic:
    def __init__(self, cluster: KafkaCluster) -> None:
        self.bootstrap = cluster.bootstrap_servers
        self.name = unique_topic("products")
        cluster.create_topic(self.name, PARTITIONS)
        kafka_client.produce_messages(self.bootstrap, product_messages(), self.name)
        self.messages = with_offsets(product_messages(), self.name)

    def reader(self, spark: SparkSession, fmt: str = "cdc-debezium") -> DataFrameReader:
        return (
            spark.read.format(fmt)
            .option("kafka.bootstrap.servers", self.bootstrap)
            .option("columns", PRODUCTS)
        )


@pytest.fixture(scope="module")
def products(kafka_cluster: KafkaCluster) -> ProductsTopic:
    return ProductsTopic(kafka_cluster)


def test_kafka_metadata_columns(spark: SparkSession, products: ProductsTopic) -> None:
    df = (
        products.reader(spark)
        .option("subscribe", products.name)
        .option("metadata", f"source.table,{KAFKA_METADATA}")
        .load()
    )
    assert df.columns == [
        *SCHEMA.names,
        "source_table",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "key",
        "headers",
        "_row_kind",
    ]
    types = {f.name: f.dataType for f in df.schema.fields}
    assert types["partition"] == st.IntegerType() and types["offset"] == st.LongType()
    assert types["timestamp"] == st.TimestampType() and types["key"] == st.BinaryType()
    want = expected_rows(products.messages)
    assert len(want) == len(GOLDEN_ROWS)  # the tombstone is no change
    assert observed(df) == want


def test_include_headers_adds_the_headers_column_as_spark_kafka_does(
    spark: SparkSession, products: ProductsTopic
) -> None:
    df = (
        products.reader(spark)
        .option("subscribe", products.name)
        .option("includeHeaders", "true")
        .option("metadata", "partition,offset")
        .load()
    )
    assert df.columns == [*SCHEMA.names, "partition", "offset", "headers", "_row_kind"]
    assert df.schema["headers"].dataType == st.ArrayType(
        st.StructType([st.StructField("key", st.StringType()), st.StructField("value", st.BinaryType())])
    )
    got = [(r["partition"], r["offset"], r["headers"]) for r in df.toArrow().to_pylist()]
    want = [(p, o, headers) for _, p, o, _, _, headers, _, _ in expected_rows(products.messages)]
    assert sorted(got, key=lambda r: r[:2]) == want
    assert any(headers for _, _, headers in want) and any(headers is None for _, _, headers in want)


def test_starting_and_ending_offsets_per_partition(spark: SparkSession, products: ProductsTopic) -> None:
    t = products.name
    df = (
        products.reader(spark)
        .option("subscribe", t)
        .option("startingOffsets", orjson.dumps({t: {"0": 2, "1": -2}}).decode())
        .option("endingOffsets", orjson.dumps({t: {"0": 4, "1": -1}}).decode())
        .option("metadata", KAFKA_METADATA + ",source.table")
        .load()
    )
    want = [r for r in expected_rows(products.messages) if r[1] == 1 or 2 <= r[2] < 4]
    assert {r[1] for r in want} == {0, 1} and len(want) < len(GOLDEN_ROWS)
    assert observed(df) == want


def test_assign_reads_only_the_assigned_partitions(spark: SparkSession, products: ProductsTopic) -> None:
    df = (
        products.reader(spark)
        .option("assign", orjson.dumps({products.name: [1]}).decode())
        .option("metadata", KAFKA_METADATA + ",source.table")
        .load()
    )
    assert observed(df) == [r for r in expected_rows(products.messages) if r[1] == 1]


def test_subscribe_pattern_reads_every_matching_topic(
    spark: SparkSession, kafka_cluster: KafkaCluster, products: ProductsTopic
) -> None:
    prefix = unique_topic("pattern")
    lines = EXCLUDE.read_bytes().splitlines()
    for suffix, chunk in (("a", lines[:3]), ("b", lines[3:5])):
        kafka_cluster.create_topic(f"{prefix}.{suffix}", 1)
        kafka_client.produce_messages(
            products.bootstrap, [Message(v, partition=0) for v in chunk], f"{prefix}.{suffix}"
        )
    kafka_cluster.create_topic(f"{prefix}x.c", 1)  # not matched: the pattern must match the whole name
    kafka_client.produce_messages(products.bootstrap, [Message(lines[5], partition=0)], f"{prefix}x.c")
    df = (
        products.reader(spark)
        .option("subscribePattern", re.escape(prefix) + r"\..*")
        .option("metadata", "topic,offset")
        .load()
    )
    got = sorted((r["topic"], r["offset"], render(r)) for r in df.toArrow().to_pylist())
    assert got == [(f"{prefix}.a", i, GOLDEN_ROWS[i]) for i in range(3)] + [
        (f"{prefix}.b", i, GOLDEN_ROWS[3 + i]) for i in range(2)
    ]


def test_dead_letter_topic_gets_the_original_record_and_error_headers(
    spark: SparkSession, kafka_cluster: KafkaCluster, products: ProductsTopic
) -> None:
    source, dead = unique_topic("dl-source"), unique_topic("dl-dead")
    kafka_cluster.create_topic(source, 1)
    kafka_cluster.create_topic(dead, 1)
    good = EXCLUDE.read_bytes().splitlines()[:2]
    bad = Message(
        b'{"before":null,"after":{"id":1', b"key-1", partition=0, timestamp_ms=T0_MS, headers=(("h", b"v"),)
    )
    kafka_client.produce_messages(
        products.bootstrap, [Message(good[0], partition=0), bad, Message(good[1], partition=0)], source
    )
    df = products.reader(spark).option("subscribe", source).option("deadLetterTopic", dead).load()
    assert rendered(df) == GOLDEN_ROWS[:2]
    letters = topic_records(products.bootstrap, dead)
    assert [(m.key, m.value) for m in letters] == [(bad.key, bad.value)]
    headers = dict(letters[0].headers)
    assert headers["h"] == b"v"
    assert headers["cdcflow.error.format"] == b"debezium-json"
    assert headers["cdcflow.error.origin"] == f"topic '{source}' partition 0 offset 1".encode()
    assert headers["cdcflow.error.reason"] == b"not valid JSON (unexpected end of data at character 30)"
    assert headers["cdcflow.error.field"] == b""


def topic_records(bootstrap: str, topic: str) -> list[Message]:
    """Every record of partition 0 of ``topic``, with headers."""
    options = KafkaOptions.parse({"kafka.bootstrap.servers": bootstrap, "subscribe": topic})
    ((low, high),) = kafka_client.offset_bounds(options, [TopicPartition(topic, 0)]).values()
    return list(kafka_client.read_range(options, OffsetRange(topic, 0, low, high), include_headers=True))


def test_a_replay_can_send_its_dead_letters_to_a_topic(
    spark: SparkSession, kafka_cluster: KafkaCluster, products: ProductsTopic, tmp_path: Path
) -> None:
    dead = unique_topic("dl-replay")
    kafka_cluster.create_topic(dead, 1)
    lines = EXCLUDE.read_bytes().splitlines()
    source = tmp_path / "events.txt"
    source.write_bytes(b"\n".join([lines[0], b"{oops", lines[1]]))
    df = (
        debezium(spark)
        .option("kafka.bootstrap.servers", products.bootstrap)
        .option("deadLetterTopic", dead)
        .load(str(source))
    )
    assert rendered(df) == GOLDEN_ROWS[:2]
    letters = topic_records(products.bootstrap, dead)
    assert [(m.key, m.value, dict(m.headers)["cdcflow.error.origin"]) for m in letters] == [
        (None, b"{oops", f"{source}:2".encode())
    ]


def test_a_replay_with_a_kafka_subscription_is_refused(tmp_path: Path) -> None:
    options = {
        "path": str(EXCLUDE),
        "columns": PRODUCTS,
        "kafka.bootstrap.servers": "b:9092",
        "subscribe": "t",
    }
    with pytest.raises(ConnectorOptionError, match="both 'path' .* and Kafka options are set: use one input"):
        plan_read("debezium-json", options, None)


# --- recorded topics ----------------------------------------------------------------------------


def test_a_recorded_topic_dump_reads_like_the_topic(
    spark: SparkSession, products: ProductsTopic, tmp_path: Path
) -> None:
    dump = tmp_path / "products.jsonl"
    summary = record_topic({"kafka.bootstrap.servers": products.bootstrap, "subscribe": products.name}, dump)
    assert summary.records == len(products.messages)
    metadata = f"source.table,{KAFKA_METADATA}"
    direct = observed(
        products.reader(spark).option("subscribe", products.name).option("metadata", metadata).load()
    )
    replayed = debezium(spark).option("metadata", metadata).load(str(dump))
    assert observed(replayed) == direct == expected_rows(products.messages)
    assert observed(replayed) == direct  # a replay gives the same every time


def test_streaming_replay_of_a_directory_reads_each_file_once(spark: SparkSession, tmp_path: Path) -> None:
    source, out, checkpoint = tmp_path / "in", tmp_path / "out", tmp_path / "checkpoint"
    source.mkdir()
    lines = EXCLUDE.read_bytes().splitlines(keepends=True)
    (source / "a.txt").write_bytes(b"".join(lines[:9]))
    (source / "b.txt").write_bytes(b"".join(lines[9:12]))

    def run() -> None:
        query = (
            spark.readStream.format("cdc-debezium")
            .option("columns", PRODUCTS)
            .option("metadata", "file,line")
            .load(str(source))
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert query.exception() is None

    def written() -> list[tuple[str, int, str]]:
        rows = spark.read.parquet(str(out)).toArrow().to_pylist()
        return sorted((Path(r["file"]).name, r["line"], render(r)) for r in rows)

    def rows_of(name: str, first_line: int, last_line: int) -> list[tuple[str, int, str]]:
        """The golden rows of EXCLUDE's lines [first_line, last_line], numbered in their new file."""
        return [
            (name, line - first_line + 1, row)
            for line, row in zip(LINE_OF_ROW, GOLDEN_ROWS, strict=True)
            if first_line <= line <= last_line
        ]

    run()
    first = rows_of("a.txt", 1, 9) + rows_of("b.txt", 10, 12)
    assert written() == sorted(first)
    (source / "c.txt").write_bytes(b"".join(lines[12:]))
    run()  # the same checkpoint: only the new file is read
    assert written() == sorted(first + rows_of("c.txt", 13, 16))


def test_a_running_replay_stream_sees_files_added_to_its_directory(tmp_path: Path) -> None:
    lines = EXCLUDE.read_bytes().splitlines(keepends=True)
    (tmp_path / "a.txt").write_bytes(b"".join(lines[:2]))
    reader = CdcStreamReader(plan_read("debezium-json", {"path": str(tmp_path), "columns": PRODUCTS}, None))
    limit = reader.getDefaultReadLimit()
    first = reader.latestOffset(reader.initialOffset(), limit)
    (tmp_path / "b.txt").write_bytes(b"".join(lines[2:4]))
    second = reader.latestOffset(first, limit)
    assert sorted(second["files"]) == [str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]
    batches = [batch for p in reader.partitions(first, second) for batch in reader.read(p)]
    assert [render(row) for batch in batches for row in batch.to_pylist()] == GOLDEN_ROWS[2:4]


# --- upsert-kafka and read limits ---------------------------------------------------------------


def test_upsert_kafka_tombstone_is_a_delete_of_its_key(
    spark: SparkSession, kafka_cluster: KafkaCluster, products: ProductsTopic
) -> None:
    topic = unique_topic("upsert")
    kafka_cluster.create_topic(topic, 1)

    def record(key: int, value: dict[str, Any] | None) -> Message:
        return Message(None if value is None else orjson.dumps(value), orjson.dumps({"id": key}), partition=0)

    records = [
        record(1, {"id": 1, "name": "scooter"}),
        record(2, {"id": 2, "name": "hammer"}),
        record(1, {"id": 1, "name": "scooter v2"}),
        record(2, None),
    ]
    kafka_client.produce_messages(products.bootstrap, records, topic)
    df = (
        spark.read.format("cdc-upsert-kafka")
        .option("kafka.bootstrap.servers", products.bootstrap)
        .option("subscribe", topic)
        .option("columns", "id INT NOT NULL, name STRING")
        .option("key.fields", "id")
        .option("metadata", "offset")
        .load()
    )
    got = [(r["offset"], r["_row_kind"], r["id"], r["name"]) for r in df.toArrow().to_pylist()]
    assert got == [
        (0, "+U", 1, "scooter"),
        (1, "+U", 2, "hammer"),
        (2, "+U", 1, "scooter v2"),
        (3, "-D", 2, None),
    ]


def test_max_offsets_per_trigger_splits_a_stream_into_small_micro_batches(
    spark: SparkSession, kafka_cluster: KafkaCluster, products: ProductsTopic, tmp_path: Path
) -> None:
    topic, limit = unique_topic("limited"), 8
    kafka_cluster.create_topic(topic, 3)
    inserts = [line for line in EXCLUDE.read_bytes().splitlines() if b'"op":"c"' in line]
    kafka_client.produce_messages(
        products.bootstrap, [Message(v, partition=i % 3) for i, v in enumerate(inserts * 2)], topic
    )
    query = (
        spark.readStream.format("cdc-debezium")
        .option("kafka.bootstrap.servers", products.bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(limit))
        .option("columns", PRODUCTS)
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 2 * len(inserts) == 22
    assert len(sizes) >= 3 and max(sizes) <= limit


def test_register_is_explicit_and_idempotent(spark: SparkSession) -> None:
    import cdcflow

    cdcflow.register(spark)
    cdcflow.register(spark)
    assert rendered(debezium(spark).load(str(EXCLUDE))) == GOLDEN_ROWS


def test_batch_start_after_end_is_an_error_not_an_empty_read(
    spark: SparkSession, kafka_cluster: KafkaCluster
) -> None:
    topic = unique_topic("start-after-end")
    kafka_cluster.create_topic(topic, PARTITIONS)
    messages = with_offsets(product_messages(), topic)
    kafka_client.produce_messages(kafka_cluster.bootstrap_servers, messages, topic)
    others = {str(p): 0 for p in range(1, PARTITIONS)}
    reader = (
        debezium(spark)
        .option("kafka.bootstrap.servers", kafka_cluster.bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", orjson.dumps({topic: {"0": 3, **others}}).decode())
        .option("endingOffsets", orjson.dumps({topic: {"0": 1, **others}}).decode())
    )
    with pytest.raises(Exception, match="starting offset 3 is after the ending offset 1"):
        reader.load().collect()
