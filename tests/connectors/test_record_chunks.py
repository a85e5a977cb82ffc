"""Kafka records read a consume call at a time (:class:`RecordChunk`): the same messages, metadata
columns and changelog as record by record, and the consumer's prefetch bounded by the range."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from kafka_fixture import KafkaCluster, unique_topic
from pyspark.sql import types as st
from test_decode_batches import COLUMNS, SCHEMA, blocks_apart, control_plan, expected
from test_decode_batches import control_messages as control_events

from cdcflow.connectors.errors import DataLossError
from cdcflow.connectors.kafka import options as kafka_options
from cdcflow.connectors.kafka import producer as kafka_producer
from cdcflow.connectors.kafka import reader as kafka_reader
from cdcflow.connectors.kafka.reader import RecordChunk, blocks
from cdcflow.connectors.spark.arrow_types import arrow_schema
from cdcflow.connectors.spark.decode import BLOCK_SIZE, BatchDecoder
from cdcflow.connectors.spark.metadata import CONNECTOR_METADATA, metadata_array
from cdcflow.connectors.spark.read_plan import plan_read
from cdcflow.core.model import Change
from cdcflow.core.rowkind import RowKind
from cdcflow.formats import Message, render_change

MIXED = [
    Message(b'{"a":1}', b"k1", "t", 0, 10, 1_700_000_000_000, (("h", b"v"), ("empty", None))),
    Message(None, b"k2", "t", 0, 11, None, ()),
    Message(b'{"a":2}', None, "t", 0, 13, 5, (("h", b"w"),)),
]


def arrow_type(spark_type: st.DataType) -> pa.DataType:
    return arrow_schema(st.StructType([st.StructField("c", spark_type)])).field(0).type


def chunks_of(messages: list[Message], size: int) -> list[RecordChunk]:
    return [
        RecordChunk.of("t", 0, messages[start : start + size], headers=True)
        for start in range(0, len(messages), size)
    ]


def test_a_chunk_gives_back_its_messages_and_their_metadata_columns() -> None:
    chunk = RecordChunk.of("t", 0, MIXED, headers=True)
    assert chunk.messages() == MIXED and len(chunk) == 3
    for key, spark_type in CONNECTOR_METADATA.items():
        want = metadata_array(key, MIXED, arrow_type(spark_type))
        assert chunk.metadata_array(key, arrow_type(spark_type)).equals(want), key
    bare = RecordChunk.of("t", 0, MIXED, headers=False)
    assert [m.headers for m in bare.messages()] == [(), (), ()] and bare.record_headers() == [(), (), ()]
    headers_type = arrow_type(CONNECTOR_METADATA["headers"])
    assert bare.metadata_array("headers", headers_type).null_count == 3
    with pytest.raises(ValueError, match="same headers setting"):
        RecordChunk.of("t", 0, MIXED, headers=True).extend(bare)
    with pytest.raises(KeyError):
        chunk.metadata_array("unknown", pa.string())


def test_blocks_join_consecutive_chunks_without_cutting_one() -> None:
    messages = [Message(b"{}", None, "t", 0, offset) for offset in range(25)]
    joined = list(blocks(chunks_of(messages, 4), 10))
    assert [len(block) for block in joined] == [8, 8, 9]  # 4+4, 4+4, 4+4+1: never above 10
    assert [m for block in joined for m in block.messages()] == messages
    other = RecordChunk.of("t", 1, [Message(b"{}", None, "t", 1, 0)], headers=True)
    assert [len(b) for b in blocks([*chunks_of(messages[:2], 1), other], 10)] == [2, 1]  # a partition each
    bare = RecordChunk.of("t", 0, messages[2:4], headers=False)
    assert [len(b) for b in blocks([*chunks_of(messages[:2], 2), bare], 10)] == [2, 2]  # headers or not
    assert list(blocks([RecordChunk.of("t", 0, [], headers=True)], 10)) == []


def rendered(plan: Any, batches: list[pa.RecordBatch]) -> list[tuple[Any, ...]]:
    rows = [row for batch in batches for row in batch.to_pylist()]
    return [
        (
            row["offset"],
            row.get("_control"),
            render_change(Change(RowKind.from_short_string(row["_row_kind"]), row), SCHEMA),
        )
        if row["_row_kind"] is not None
        else (row["offset"], row.get("_control"), None)
        for row in rows
    ]


@pytest.mark.parametrize("unavailable", ["fill", "report"])
@pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "no-keys"])
def test_chunks_decode_as_the_per_record_decoder_does(unavailable: str, keyed: bool) -> None:
    raw = {
        "kafka.bootstrap.servers": "unused:9092",
        "subscribe": "t",
        "columns": COLUMNS,
        "metadata": "offset",
    }
    plan = plan_read("debezium-json", {**raw, "unavailable-values": unavailable}, None)
    messages = blocks_apart(keyed)
    decoder = BatchDecoder(plan)
    got = [(o, r) for o, _, r in rendered(plan, list(decoder.record_batches(chunks_of(messages, 5000))))]
    assert got == expected({"unavailable-values": unavailable}, messages)
    reference = BatchDecoder(plan)
    list(reference.batches(messages))
    assert decoder.metrics == reference.metrics


@pytest.mark.parametrize("control", ["emit", "skip"])
def test_chunks_place_control_events_as_messages_do(control: str) -> None:
    plan = control_plan(control)
    messages = control_events()
    by_chunk = list(BatchDecoder(plan).record_batches(chunks_of(messages, BLOCK_SIZE)))
    by_message = list(BatchDecoder(plan).batches(messages))
    assert pa.Table.from_batches(by_chunk).equals(pa.Table.from_batches(by_message))


def test_a_range_readers_consumer_prefetches_what_the_range_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    """librdkafka's default keeps 100,000 records queued: a 25,000-record range fetched and
    decompressed four times what it read. The user's kafka.* settings still win."""
    import confluent_kafka

    configs: list[dict[str, Any]] = []

    class Recorder:
        def __init__(self, config: dict[str, Any]) -> None:
            configs.append(config)

    monkeypatch.setattr(confluent_kafka, "Consumer", Recorder)
    options = kafka_options.KafkaOptions.parse({"kafka.bootstrap.servers": "b:9092", "subscribe": "t"})
    kafka_reader.new_consumer(options, prefetch=7)
    kafka_reader.new_consumer(options)
    given = {"kafka.bootstrap.servers": "b:9092", "subscribe": "t", "kafka.queued.min.messages": "77"}
    kafka_reader.new_consumer(kafka_options.KafkaOptions.parse(given), prefetch=7)
    assert (
        configs[0]["queued.min.messages"],
        configs[0]["fetch.queue.backoff.ms"],
        configs[0]["fetch.wait.max.ms"],
    ) == (7, 5, 10)
    assert not {"queued.min.messages", "fetch.queue.backoff.ms", "fetch.wait.max.ms"} & set(configs[1])
    assert str(configs[2]["queued.min.messages"]) == "77"


@pytest.mark.integration
def test_chunks_read_from_a_broker_are_the_records_in_offset_order(kafka_cluster: KafkaCluster) -> None:
    from confluent_kafka import Producer

    topic = unique_topic("chunks")
    kafka_cluster.create_topic(topic)
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap_servers})
    for index in range(12_000):
        headers = [("n", str(index).encode())] if index % 3 == 0 else None
        producer.produce(topic, b'{"i":%d}' % index, None if index % 5 else b"k", headers=headers)
    producer.flush()
    options = kafka_options.KafkaOptions.parse(
        {"kafka.bootstrap.servers": kafka_cluster.bootstrap_servers, "subscribe": topic}
    )
    rng = kafka_options.OffsetRange(topic, 0, 100, 11_900)
    chunks = list(kafka_reader.read_range_chunks(options, rng, include_headers=True))
    assert len(chunks) > 1 and all(len(chunk) <= 5000 for chunk in chunks)
    records = [m for chunk in chunks for m in chunk.messages()]
    assert [m.offset for m in records] == list(range(100, 11_900))
    assert [m.value for m in records] == [b'{"i":%d}' % i for i in range(100, 11_900)]
    assert [m.key for m in records] == [None if i % 5 else b"k" for i in range(100, 11_900)]
    assert [m.headers for m in records] == [
        (("n", str(i).encode()),) if i % 3 == 0 else () for i in range(100, 11_900)
    ]
    assert all(m.timestamp_ms is not None and m.topic == topic and m.partition == 0 for m in records)
    assert (records[0].value, records[0].key, records[1].key) == (b'{"i":100}', b"k", None)
    assert (records[2].headers, records[3].headers) == ((("n", b"102"),), ())


@pytest.mark.integration
def test_a_pooled_consumer_reads_range_after_range_of_several_partitions(
    kafka_cluster: KafkaCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = unique_topic("pooled")
    kafka_cluster.create_topic(topic, 2)
    messages = [Message(b"p%d-%d" % (p, i), partition=p) for i in range(3000) for p in (0, 1)]
    kafka_producer.produce_messages(kafka_cluster.bootstrap_servers, messages, topic)
    made = []
    new_consumer = kafka_reader.new_consumer

    def counted(*args: Any, **kwargs: Any) -> Any:
        made.append(new_consumer(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(kafka_reader, "new_consumer", counted)
    options = kafka_options.KafkaOptions.parse(
        {"kafka.bootstrap.servers": kafka_cluster.bootstrap_servers, "subscribe": topic}
    )
    pool = kafka_reader.ConsumerPool()
    # Ranges as micro-batches give them, partitions in turn, and then some read again: one that ends
    # at the partition's end (its end event queued), followed by earlier offsets of the same partition.
    ranges = [
        (0, 0, 1000),
        (1, 0, 1000),
        (0, 2000, 3000),
        (0, 1000, 2000),
        (1, 1000, 2000),
        (0, 0, 1000),
        (1, 2000, 3000),
        (1, 2990, 3000),
    ]
    for partition, start, end in ranges:
        rng = kafka_options.OffsetRange(topic, partition, start, end)
        chunks = kafka_reader.read_range_chunks(options, rng, pool=pool)
        records = [m for chunk in chunks for m in chunk.messages()]
        assert [m.offset for m in records] == list(range(start, end))
        assert [m.value for m in records] == [b"p%d-%d" % (partition, i) for i in range(start, end)]
        assert {(m.topic, m.partition) for m in records} == {(topic, partition)}
    assert len(made) == 2  # one per prefetch: the 1,000-record ranges' (1,024), the 10-record range's (16)


class FakeRecord:
    def __init__(
        self, offset: int, *, stamp: int | None = 1000, error: Any = None, partition: int = 0
    ) -> None:
        self._offset, self._stamp, self._error, self._partition = offset, stamp, error, partition

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return self._partition

    def error(self) -> Any:
        return self._error

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_NOT_AVAILABLE

        return (TIMESTAMP_NOT_AVAILABLE, -1) if self._stamp is None else (TIMESTAMP_CREATE_TIME, self._stamp)

    def value(self) -> bytes:
        return b"v%d" % self._offset if self._partition == 0 else b"p%dv%d" % (self._partition, self._offset)

    def key(self) -> bytes:
        return b"k%d" % self._offset

    def headers(self) -> list[tuple[str, bytes]]:
        return [("o", b"%d" % self._offset)]


class FakeConsumer:
    """Answers consume() with scripted batches; watermarks (0, 100)."""

    def __init__(self, batches: list[list[FakeRecord]]) -> None:
        self.batches = batches
        self.assigned = self.unassigned = self.closed = 0
        self.unversioned: list[FakeRecord] = []

    def assign(self, partitions: Any) -> None:
        self.assigned += 1

    def unassign(self) -> None:
        self.unassigned += 1

    def consume(self, num_messages: int, timeout: float) -> list[FakeRecord]:
        if self.unversioned:  # librdkafka hands these out whatever is assigned
            events, self.unversioned = self.unversioned, []
            return events
        if self.assigned == self.unassigned:
            return []  # nothing assigned: nothing fetched
        return self.batches.pop(0) if self.batches else []

    def get_watermark_offsets(self, partition: Any, timeout: float, cached: bool) -> tuple[int, int]:
        return 0, 100

    def close(self) -> None:
        self.closed += 1


def scripted_read(
    monkeypatch: pytest.MonkeyPatch, batches: list[list[FakeRecord]], start: int, end: int
) -> tuple[list[RecordChunk], list[int | None]]:
    prefetched: list[int | None] = []

    def consumer(options: Any, on_error: Any = None, *, prefetch: int | None = None) -> FakeConsumer:
        prefetched.append(prefetch)
        return FakeConsumer(batches)

    monkeypatch.setattr(kafka_reader, "new_consumer", consumer)
    options = kafka_options.KafkaOptions.parse({"kafka.bootstrap.servers": "b:9092", "subscribe": "t"})
    rng = kafka_options.OffsetRange("t", 0, start, end)
    return list(kafka_reader.read_range_chunks(options, rng, include_headers=True)), prefetched


def test_a_batch_with_gaps_or_past_the_range_is_read_record_by_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A batch of the next offsets is taken whole; a gap (compaction, a transaction marker), an
    out-of-order offset or a record past the range end takes the per-record checks."""
    batches = [
        [FakeRecord(0), FakeRecord(1, stamp=None), FakeRecord(2)],  # whole
        [FakeRecord(3), FakeRecord(5)],  # a gap above the low watermark: no data loss
        [FakeRecord(6), FakeRecord(8), FakeRecord(7)],  # first, last and length fit, the middle not
        [FakeRecord(9), FakeRecord(10), FakeRecord(11), FakeRecord(12)],  # 12 is past the end
    ]
    chunks, prefetched = scripted_read(monkeypatch, batches, 0, 12)
    assert [chunk.offsets for chunk in chunks] == [[0, 1, 2], [3, 5], [6, 8], [9, 10, 11]]
    assert chunks[0].timestamps_ms == [1000, None, 1000]
    assert chunks[0].values == [b"v0", b"v1", b"v2"] and chunks[0].keys == [b"k0", b"k1", b"k2"]
    assert chunks[1].headers == [(("o", b"3"),), (("o", b"5"),)]
    assert prefetched == [12]  # librdkafka queues no more than the range holds


def test_a_range_prefetches_what_it_holds_up_to_two_consume_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    batches = [[FakeRecord(40), FakeRecord(41)]]
    chunks, prefetched = scripted_read(monkeypatch, batches, 40, 42)
    assert [chunk.offsets for chunk in chunks] == [[40, 41]] and prefetched == [2]
    options = kafka_options.KafkaOptions.parse({"kafka.bootstrap.servers": "b:9092", "subscribe": "t"})
    batches.append([FakeRecord(0)])
    next(kafka_reader.read_range_chunks(options, kafka_options.OffsetRange("t", 0, 0, 30_000)))
    assert prefetched == [2, 10_000]


def test_records_and_events_of_another_partition_are_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a pooled consumer's previous range may leave behind: never read as this range's, and its
    end-of-partition event never ends this range."""
    from confluent_kafka import KafkaError

    eof = KafkaError(KafkaError._PARTITION_EOF)
    batches = [
        [FakeRecord(0, partition=1), FakeRecord(1, partition=1)],  # all another partition's
        [FakeRecord(50, partition=1, error=eof)],  # its end: offset 50, past this range's end
        [FakeRecord(2, partition=1), FakeRecord(0), FakeRecord(1)],  # mixed
        [FakeRecord(2)],
    ]
    chunks, _ = scripted_read(monkeypatch, batches, 0, 3)
    assert [chunk.offsets for chunk in chunks] == [[0, 1], [2]]
    assert [value for chunk in chunks for value in chunk.values] == [b"v0", b"v1", b"v2"]


def test_a_pool_keeps_a_consumer_that_read_its_range_and_closes_one_that_failed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from confluent_kafka import KafkaError

    made: list[FakeConsumer] = []
    script: list[list[FakeRecord]] = []

    def consumer(options: Any, on_error: Any = None, *, prefetch: int | None = None) -> FakeConsumer:
        made.append(FakeConsumer(script))
        return made[-1]

    monkeypatch.setattr(kafka_reader, "new_consumer", consumer)
    options = kafka_options.KafkaOptions.parse({"kafka.bootstrap.servers": "b:9092", "subscribe": "t"})
    pool = kafka_reader.ConsumerPool(size=1)

    def read(start: int, end: int, *batches: list[FakeRecord]) -> list[int]:
        script.extend(batches)
        rng = kafka_options.OffsetRange("t", 0, start, end)
        return [o for chunk in kafka_reader.read_range_chunks(options, rng, pool=pool) for o in chunk.offsets]

    gone = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
    assert read(0, 2, [FakeRecord(0), FakeRecord(1)]) == [0, 1]
    made[0].unversioned.append(FakeRecord(2, error=gone))  # queued while idle: not the next range's
    assert read(2, 4, [FakeRecord(2), FakeRecord(3)]) == [2, 3]
    assert len(made) == 1 and (made[0].assigned, made[0].unassigned, made[0].closed) == (2, 2, 0)
    with pytest.raises(DataLossError, match="does not exist any more"):
        read(4, 6, [FakeRecord(4, error=gone)])
    assert made[0].closed == 1  # not kept
    assert read(6, 8, [FakeRecord(6), FakeRecord(7)]) == [6, 7]
    assert len(made) == 2
    reader = kafka_reader.read_range_chunks(options, kafka_options.OffsetRange("t", 0, 8, 10), pool=pool)
    script.append([FakeRecord(8)])
    assert next(reader).offsets == [8]
    reader.close()  # left early: its consumer is closed, not kept
    assert len(made) == 2 and made[1].closed == 1
    assert read(10, 12, [FakeRecord(10), FakeRecord(11)]) == [10, 11] and len(made) == 3
