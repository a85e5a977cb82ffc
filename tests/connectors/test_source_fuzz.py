"""The seeded fuzz through the Spark sources: mutated messages of every format (``fuzz_corpus.py``)
read by the ``cdc-*`` sources from topic dumps and from Kafka end as the per-record decoder says, with
no failed query and no internal error: the same counts, the same dead letters (exact bytes, the
coordinates, the field and the reason) and the same row kinds; and where the columnar path decodes a
block of them, its rows and counts are the per-record decoder's (issue 27).

Each input is one Spark job reading every configuration (a union of the sources). The seed is
``CDCFLOW_FUZZ_SEED`` (default below) to rotate it; the failing seed is in the assertion message.
Beside the fuzz, the hostile values it found failing queries, one test each.
"""

from __future__ import annotations

import base64
import functools
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, cast

import orjson
import pyarrow as pa
import pytest
from fuzz_corpus import Mutator, Target, targets
from kafka_fixture import KafkaCluster, unique_topic
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 - Spark's own spelling

from cdcflow.connectors.kafka import producer as kafka_producer
from cdcflow.connectors.replay.dumps import write_dump
from cdcflow.connectors.spark.accounting import MessageCounts, read_counts
from cdcflow.connectors.spark.arrow_types import ChangeBatchBuilder, arrow_schema, struct_type
from cdcflow.connectors.spark.dead_letters import dead_letter_record, read_dead_letters
from cdcflow.formats import DecodeOutput, Message
from cdcflow.formats.base import FormatMetrics
from cdcflow.formats.debezium.arrow import ColumnarDecoder

SEED = int(os.environ.get("CDCFLOW_FUZZ_SEED", "27"))
MUTANTS = 100
"""Mutated messages per configuration."""
BIG = 2_000
"""The longest values and deepest nestings the mutator makes (the formats' fuzz has 100,000)."""
T0_MS = 1_700_000_000_000
SOURCES = {
    "debezium-json": "cdc-debezium",
    "debezium-avro-confluent": "cdc-debezium-avro",
    "debezium-json-registry": "cdc-debezium-json-registry",
    "canal-json": "cdc-canal",
    "maxwell-json": "cdc-maxwell",
    "ogg-json": "cdc-ogg",
    "generic": "cdc-generic",
    "upsert-kafka": "cdc-upsert-kafka",
}
#: One configuration of each format (Debezium JSON with and without schema blocks), with declared
#: columns and metadata columns.
READS = (
    "postgres-ingest-columnar",
    "postgres-ingest-columnar-schemas",
    "flink-debezium-data-schema-include+metadata",
    "avro-declared+metadata",
    "registry-small+metadata",
    "flink-canal-data+metadata",
    "flink-maxwell-data+metadata",
    "flink-ogg-data+metadata",
    "generic-flink-debezium-postgres-data-schema-exclude",
    "upsert-kafka-flink-maxwell-data",
)
#: The configurations the columnar path reads (``cdcflow ingest``'s, without and with Connect's schema
#: blocks). A Spark range of mutants nearly always holds one that sends its whole block per record, so
#: the columnar rows are compared here on small blocks, without Spark.
COLUMNAR = ("postgres-ingest-columnar", "postgres-ingest-columnar-schemas")


@dataclass(frozen=True)
class Read:
    """One configuration's mutants, where they sit, and what the per-record decoder makes of them."""

    target: Target
    partition: int
    messages: tuple[Message, ...]
    expected: DecodeOutput


def _expected(target: Target, messages: tuple[Message, ...]) -> DecodeOutput:
    """The per-record outcome, checking that each message has exactly one: changes, a dead letter
    with its reason, a control event, filtered, a tombstone or empty."""
    decoder = target.decoder()
    total = DecodeOutput()
    outcomes = ("changed_messages", "dead_letters", "events", "filtered", "tombstones", "empty")
    for message in messages:
        out = DecodeOutput()
        decoder.decode(message, out)
        assert sum(getattr(out.metrics, name) for name in outcomes) == 1, message.origin()
        for letter in out.dead_letters:
            assert letter.message is message and letter.reason.strip(), message.origin()
        total.changes += out.changes
        total.dead_letters += out.dead_letters
        for counter in fields(FormatMetrics):
            name = counter.name
            setattr(total.metrics, name, getattr(total.metrics, name) + getattr(out.metrics, name))
    assert total.metrics.internal_errors == 0
    return total


@functools.cache
def fuzzed() -> tuple[str, tuple[Read, ...]]:
    """The mutants of every configuration in READS, each at its own partition of one topic."""
    by_name = {target.name: target for target in targets()}
    mutator = Mutator(SEED, big=BIG)
    topic = unique_topic("fuzz")
    reads = []
    for partition, name in enumerate(READS):
        target = by_name[name]
        messages = tuple(
            _placed(mutator.message(target, index), topic, partition, index) for index in range(MUTANTS)
        )
        reads.append(Read(target, partition, messages, _expected(target, messages)))
    return topic, tuple(reads)


def _placed(message: Message, topic: str, partition: int, offset: int) -> Message:
    return Message(message.value, message.key, topic, partition, offset, T0_MS + offset, message.headers)


def _options(read: Read, base: Path) -> dict[str, str]:
    target = read.target
    options = {f"{target.format}.{key}": value for key, value in target.options.items()}
    where = base / str(read.partition)
    options.update(
        columns=target.ddl or "", deadLetterPath=str(where / "dead"), accountingPath=str(where / "counts")
    )
    if target.metadata:
        options["metadata"] = ",".join(target.metadata)
    return options


def _row_kinds(frames: list[DataFrame]) -> dict[int, Counter[str]]:
    """One Spark job over every source: each read's row kinds."""
    union = functools.reduce(DataFrame.unionByName, frames)
    kinds: dict[int, Counter[str]] = {}
    for row in union.collect():
        kinds.setdefault(row["read"], Counter())[row["_row_kind"]] += 1
    return kinds


def _check(reads: tuple[Read, ...], base: Path, kinds: dict[int, Counter[str]]) -> None:
    for read in reads:
        name, where = read.target.name, base / str(read.partition)
        context = f"{name} (seed {SEED})"
        expected = read.expected
        counts = read_counts(str(where / "counts"))
        assert counts == MessageCounts.of(expected.metrics), context
        assert counts.read == counts.accounted() == MUTANTS and counts.internal_errors == 0, context
        letters = sorted(read_dead_letters(str(where / "dead")), key=lambda record: record["offset"])
        wanted = [dead_letter_record(letter) for letter in expected.dead_letters]
        assert [_placeless(letter) for letter in letters] == [_placeless(letter) for letter in wanted], (
            context
        )
        for letter, want in zip(letters, wanted, strict=True):  # a dump's letters also name its line
            assert letter["origin"].startswith(want["origin"]), context
        rows = Counter(change.kind.value for change in expected.changes)
        assert kinds.get(read.partition, Counter()) == rows, context


def _placeless(record: dict[str, Any]) -> dict[str, Any]:
    """A dead-letter record without the file and line a topic dump adds to the Kafka coordinates."""
    return {key: value for key, value in record.items() if key not in ("origin", "file", "line")}


def test_mutants_of_every_format_read_from_dumps_end_as_per_record(
    spark: SparkSession, tmp_path: Path
) -> None:
    _, reads = fuzzed()
    assert {read.target.format for read in reads} == set(SOURCES)
    frames = []
    for read in reads:
        path = tmp_path / "in" / f"{read.partition}.dump.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_dump(path, read.messages)
        frame = (
            spark.read.format(SOURCES[read.target.format])
            .options(**_options(read, tmp_path / "out"))
            .load(str(path))
        )
        frames.append(frame.select(F.lit(read.partition).alias("read"), "_row_kind"))
    _check(reads, tmp_path / "out", _row_kinds(frames))


@pytest.mark.integration
def test_mutants_of_every_format_read_from_kafka_end_as_per_record(
    spark: SparkSession, kafka_cluster: KafkaCluster, tmp_path: Path
) -> None:
    topic, reads = fuzzed()
    kafka_cluster.create_topic(topic, len(reads))
    sent = kafka_producer.produce_messages(
        kafka_cluster.bootstrap_servers, [m for read in reads for m in read.messages], topic
    )
    assert sent == len(reads) * MUTANTS
    frames = []
    for read in reads:
        frame = (
            spark.read.format(SOURCES[read.target.format])
            .option("kafka.bootstrap.servers", kafka_cluster.bootstrap_servers)
            .option("assign", f'{{"{topic}":[{read.partition}]}}')
            .options(**_options(read, tmp_path / "out"))
            .load()
        )
        frames.append(frame.select(F.lit(read.partition).alias("read"), "_row_kind"))
    _check(reads, tmp_path / "out", _row_kinds(frames))


#: Log positions no BIGINT holds (or that are no number), as the connectors write them.
POSITIONS_BEYOND_BIGINT = (
    {"connector": "postgresql", "lsn": 2**64 - 1},
    {"connector": "postgresql", "sequence": '["1","9223372036854775808"]', "lsn": 2},
    {"connector": "postgresql", "lsn": True},
    {"connector": "sqlserver", "commit_lsn": "ffffffffffffffffff:0:0"},
    {"connector": "mysql", "file": "mysql-bin.000003", "pos": 1e79},
    {"connector": "oracle", "scn": "12345678901234567890"},
)
FIELDS_BEYOND_BIGINT = [
    "source.lsn",
    "source.sequence",
    "source.lsn",
    "source.commit_lsn",
    "source.pos",
    "source.scn",
]


def test_a_log_position_beyond_bigint_is_one_dead_letter_not_a_failed_query(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The columnar configuration (a block with such a position falls back) and a per-record one."""
    good = {"connector": "postgresql", "sequence": '["10","20"]', "lsn": 20}
    sources = [good, *POSITIONS_BEYOND_BIGINT, good]
    values = [
        orjson.dumps({"op": "c", "after": {"id": n, "price": "1.50"}, "source": source})
        for n, source in enumerate(sources)
    ]
    messages = [Message(v, None, "pg", 0, n, T0_MS) for n, v in enumerate(values)]
    write_dump(tmp_path / "in.dump.jsonl", messages)
    configurations = ("id INT NOT NULL", "id INT NOT NULL, price DECIMAL(5, 2)")
    frames = [
        spark.read.format("cdc-debezium")
        .option("columns", columns)
        .option("metadata", "source.sequence,source.lsn")
        .option("deadLetterPath", str(tmp_path / str(read) / "dead"))
        .load(str(tmp_path / "in.dump.jsonl"))
        .select(F.lit(read).alias("read"), "id", "source_sequence", "source_lsn")
        for read, columns in enumerate(configurations)
    ]
    rows = functools.reduce(DataFrame.unionByName, frames).collect()
    last = len(sources) - 1
    assert sorted(tuple(row) for row in rows) == [
        (read, id_, [10, 20], 20) for read in range(len(configurations)) for id_ in (0, last)
    ]
    for read in range(len(configurations)):
        letters = sorted(read_dead_letters(str(tmp_path / str(read) / "dead")), key=lambda r: r["offset"])
        assert [letter["field"] for letter in letters] == FIELDS_BEYOND_BIGINT
        for letter, message in zip(letters, messages[1:-1], strict=True):
            assert letter["origin"].startswith(f"topic 'pg' partition 0 offset {message.offset} ")
            assert base64.b64decode(letter["value"]) == message.value
            assert "beyond BIGINT" in letter["reason"] or "a log position is a number" in letter["reason"]


def _blocks(messages: tuple[Message, ...]) -> Iterator[tuple[Message, ...]]:
    """Every message alone, then blocks of four and of all."""
    yield from ((message,) for message in messages)
    yield from (messages[at : at + 4] for at in range(0, len(messages), 4))
    yield messages


def _comparable(batch: pa.RecordBatch) -> list[tuple[Any, ...]]:
    """Rows with floats as their exact text (-0.0 is not 0.0, NaN is NaN)."""
    return [tuple(repr(v) if isinstance(v, float) else v for v in row.values()) for row in batch.to_pylist()]


@pytest.mark.parametrize("name", COLUMNAR)
def test_the_columnar_path_decodes_mutants_as_the_per_record_decoder(name: str) -> None:
    _, reads = fuzzed()
    [read] = [read for read in reads if read.target.name == name]
    decoder = read.target.decoder()
    output = decoder.schema
    columnar = ColumnarDecoder.for_decoder(decoder, arrow_schema(struct_type(output)))
    assert columnar is not None
    target = pa.schema([*arrow_schema(struct_type(output)), pa.field("_row_kind", pa.string())])
    builder = ChangeBatchBuilder(output, "_row_kind", target)
    decoded = 0
    for block in _blocks(read.messages):
        values, headers = [m.value for m in block], [m.headers for m in block]
        # Kafka values as the cdc-* source reads them, as Spark's Kafka source hands them to
        # decode_kafka, and a file's lines (where the messages are lines and carry no headers).
        results = [columnar.decode(values, headers=headers)]
        results.append(columnar.decode_array(pa.array(values, pa.binary()), headers=headers))
        if all(v and b"\n" not in v and b"\r" not in v for v in values) and not any(headers):
            results.append(columnar.decode_lines(b"\n".join(cast("list[bytes]", values))))
        if results[0] is None:
            continue
        decoded += len(block)
        expected = _expected(read.target, block)
        assert expected.dead_letters == [] and expected.metrics.events == 0
        rows = _comparable(builder.build(expected.changes))
        metrics = expected.metrics
        for result in results:
            if result is None:
                continue
            assert _comparable(result.rows) == rows, block[0].origin()
            got = (result.changed, result.unavailable_values, result.filled_values)
            assert got == (metrics.changed_messages, metrics.unavailable_values, metrics.filled_values)
    assert decoded >= MUTANTS // 10, "the mutants left as recorded at least go columnar"
