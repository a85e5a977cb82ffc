"""Reading one offset range of one Kafka partition, as Spark's Kafka source does, on an executor.

The consumer is assigned and positioned by hand (no group membership, no commits) and created inside
:func:`read_range`, never pickled. Offsets below the low watermark or past the end of the partition
are data loss (``failOnDataLoss``); gaps above the low watermark (compaction, transaction markers,
records of aborted transactions) are skipped silently, as in Spark. Reads are ``read_committed``
unless ``kafka.isolation.level`` says otherwise.

The records come in chunks (:class:`RecordChunk`): consecutive records of one partition, field by
field. The columnar decoder needs their values as a list and the metadata columns as arrays, so a
chunk keeps each field as a list instead of a :class:`~cdcflow.formats.base.Message` per record (~3 µs
a record to build and read back). Messages are built only for a block the per-record decoder takes (a
placeholder, a bad record, a control event).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.connectors.errors import KafkaConnectorError
from cdcflow.connectors.kafka.offsets import report_data_loss
from cdcflow.connectors.kafka.options import KafkaOptions, OffsetRange, require_kafka
from cdcflow.formats.base import Headers, Message

if TYPE_CHECKING:
    from confluent_kafka import Consumer, KafkaError
    from confluent_kafka import Message as KafkaMessage

    from cdcflow.connectors.kafka.options import _RedactingLogger


log = logging.getLogger("cdcflow.connectors.kafka")

_BATCH_SIZE = 5000
_PREFETCH = 2 * _BATCH_SIZE
"""Records a range reader's consumer keeps queued ahead (at most what is left of its range)."""
_REFETCH_MS = 5
_FETCH_WAIT_MS = 10
"""How long the broker holds a range reader's fetch at the end of a partition (librdkafka: 500 ms),
which a pooled consumer's next range waits for."""
_POLL_SLICE_S = 0.2
CLIENT_LOG_REPEAT_S = 60.0
"""librdkafka repeats a failing connection attempt every second or so: each distinct line (numbers
aside) is logged at most once per this many seconds, per process."""
_DIGITS = re.compile(r"\d+")
_SUPPRESSED = re.compile(r", \d+ identical error\(s\) suppressed")
"""librdkafka's count of the repeats it left out, which makes a repeated line look new."""


class _OnceLogger:
    """What librdkafka's ``logger`` setting calls, passing each distinct line on once per period."""

    last_logged: dict[str, float] = {}  # shared by every client of the process
    _lock = threading.Lock()

    def __init__(self, inner: _RedactingLogger) -> None:
        self.inner = inner

    def log(self, level: int, message: str, *args: object) -> None:
        text = message % args if args else message
        key, now = _DIGITS.sub("#", _SUPPRESSED.sub("", text)), time.monotonic()
        with self._lock:
            last = self.last_logged.get(key)
            if last is not None and now - last < CLIENT_LOG_REPEAT_S:
                return
            if len(self.last_logged) >= 1024:
                self.last_logged.clear()
            self.last_logged[key] = now
        self.inner.log(level, "%s", text)


def new_consumer(
    options: KafkaOptions,
    on_error: Callable[[KafkaError], None] | None = None,
    *,
    prefetch: int | None = None,
) -> Consumer:
    """A consumer that never joins a group or commits, and reports partition ends and lost offsets.

    ``on_error`` receives client-level errors (brokers unreachable, authentication failed). With
    ``prefetch`` (a range reader's), librdkafka keeps about that many records queued ahead instead of
    its default 100,000 (a range of 25,000 records fetched and decompressed four times as many),
    fetches again 5 ms after the queue drains below it instead of 1 s, and a fetch at the partition's
    end is answered after 10 ms instead of 500 (the user's ``kafka.*`` settings win).
    """
    require_kafka()
    from confluent_kafka import Consumer

    config = options.client.as_dict()
    config.setdefault("group.id", f"{options.group_id_prefix}-{uuid.uuid4().hex}")
    # Records of aborted transactions are never read, and offset queries answer the last stable
    # offset, so ranges end before any open transaction (kafka.isolation.level overrides).
    config.setdefault("isolation.level", "read_committed")
    config.update(
        {
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "error",
            "enable.partition.eof": True,
            "logger": _OnceLogger(options.client.redacting(log)),
        }
    )
    if on_error is not None:
        config["error_cb"] = on_error
    if prefetch is not None:
        config.setdefault("queued.min.messages", max(1, prefetch))
        config.setdefault("fetch.queue.backoff.ms", _REFETCH_MS)
        config.setdefault("fetch.wait.max.ms", _FETCH_WAIT_MS)
    return options.client.create(lambda: Consumer(config))


def read_range(
    options: KafkaOptions,
    rng: OffsetRange,
    *,
    fail_on_data_loss: bool | None = None,
    include_headers: bool | None = None,
) -> Iterator[Message]:
    """The records of ``rng`` in offset order (the options' flags unless overridden)."""
    for chunk in read_range_chunks(
        options, rng, fail_on_data_loss=fail_on_data_loss, include_headers=include_headers
    ):
        yield from chunk.messages()


def read_range_chunks(
    options: KafkaOptions,
    rng: OffsetRange,
    *,
    fail_on_data_loss: bool | None = None,
    include_headers: bool | None = None,
    pool: ConsumerPool | None = None,
) -> Iterator[RecordChunk]:
    """:func:`read_range`'s records as they are consumed, a chunk of consecutive records at a time;
    with ``pool``, by a consumer of the pool's."""
    if rng.start >= rng.end:
        return
    fail = options.fail_on_data_loss if fail_on_data_loss is None else fail_on_data_loss
    headers = options.include_headers if include_headers is None else include_headers
    prefetch = min(rng.size, _PREFETCH)
    if pool is not None:
        with pool.consumer(options, pooled_prefetch(rng.size)) as (consumer, errors):
            reader = _RangeReader(options, rng, fail, headers, consumer)
            errors.target = reader._on_client_error
            yield from reader.chunks()
        return
    route = _ErrorRoute()
    reader = _RangeReader(options, rng, fail, headers, new_consumer(options, route, prefetch=prefetch))
    route.target = reader._on_client_error
    try:
        yield from reader.chunks()
    finally:
        reader.consumer.close()


class _ErrorRoute:
    """A consumer's ``error_cb``, passed on to the reader using the consumer now."""

    def __init__(self) -> None:
        self.target: Callable[[KafkaError], None] | None = None

    def __call__(self, error: KafkaError) -> None:
        if self.target is not None:
            self.target(error)


class ConsumerPool:
    """Range readers' consumers kept between the ranges one process reads, by client settings.

    A reused Python worker reads range after range (one per partition and micro-batch); a consumer of
    its own cost each range a connection, metadata requests and librdkafka's threads (~20 ms, ~15 ms
    of CPU). A consumer that read its range to the end is unassigned, its queue drained, and kept (at
    most ``size`` in all, none idle longer than ``idle_s`` or older than ``age_s``: credentials read
    from files, say, are read again); one whose read failed or was left early is closed.

    Records, partition ends and fetch errors of an earlier assignment never reach the next reader:
    librdkafka drops what a partition's fetcher queued before ``unassign`` (its version barrier). The
    events it does not version (an offset reset, an unknown partition from metadata) and client errors
    of the idle time are drained, unread, when the consumer is taken again.
    """

    def __init__(self, size: int = 2, idle_s: float = 60.0, age_s: float = 600.0) -> None:
        self.size, self.idle_s, self.age_s = size, idle_s, age_s
        self._idle: list[_Idle] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()

    @contextlib.contextmanager
    def consumer(self, options: KafkaOptions, prefetch: int) -> Iterator[tuple[Consumer, _ErrorRoute]]:
        """An idle consumer of these settings, or a new one; kept again if the block ends normally."""
        key: Hashable = (options.client, options.group_id_prefix, prefetch)
        taken, expired = self._take(key)
        for old in expired:
            old.consumer.close()
        if taken is None:
            route = _ErrorRoute()
            consumer = new_consumer(options, route, prefetch=prefetch)
            born = time.monotonic()
        else:
            consumer, route, born = taken.consumer, taken.route, taken.born
            _drain(consumer)
        try:
            yield consumer, route
        except BaseException:
            route.target = None
            consumer.close()
            raise
        route.target = None
        try:
            consumer.unassign()
            _drain(consumer)
        except Exception:  # noqa: BLE001 - the range was read; a consumer that fails this is not kept
            consumer.close()
            return
        except BaseException:
            consumer.close()
            raise
        with self._lock:
            self._idle.append(_Idle(key, consumer, route, born, time.monotonic()))
            extra = self._idle[: max(0, len(self._idle) - self.size)]
            del self._idle[: len(extra)]
        for old in extra:
            old.consumer.close()

    def _take(self, key: Hashable) -> tuple[_Idle | None, list[_Idle]]:
        now = time.monotonic()
        with self._lock:
            if os.getpid() != self._pid:  # a fork's copies of librdkafka handles do not work: left alone
                self._idle, self._pid = [], os.getpid()
            expired = [i for i in self._idle if now - i.since > self.idle_s or now - i.born > self.age_s]
            self._idle = [i for i in self._idle if i not in expired]
            found = next((i for i in self._idle if i.key == key), None)
            if found is not None:
                self._idle.remove(found)
        return found, expired


@dataclass
class _Idle:
    key: Hashable
    consumer: Consumer
    route: _ErrorRoute
    born: float
    since: float


def _drain(consumer: Consumer) -> None:
    """Whatever the consumer has queued (it has no partition assigned), dropped unread."""
    for _ in range(100):
        if not consumer.consume(_BATCH_SIZE, timeout=0):
            return


def pooled_prefetch(size: int) -> int:
    """A pooled range reader's prefetch: the range's size rounded up to a power of two (at most twice
    what it holds), so that ranges of similar sizes share consumers."""
    return min(_PREFETCH, 1 << max(0, size - 1).bit_length())


class _RangeReader:
    def __init__(
        self,
        options: KafkaOptions,
        rng: OffsetRange,
        fail_on_data_loss: bool,
        headers: bool,
        consumer: Consumer,
    ) -> None:
        from confluent_kafka import TopicPartition

        self.options, self.rng = options, rng
        self.fail_on_data_loss, self.headers = fail_on_data_loss, headers
        self.partition = TopicPartition(rng.topic, rng.partition)
        self.last_error: str | None = None
        self.consumer = consumer
        self.next = rng.start

    def chunks(self) -> Iterator[RecordChunk]:
        topic, partition, end, headers = self.rng.topic, self.rng.partition, self.rng.end, self.headers
        self._seek(self.next)
        idle_s = 0.0
        while self.next < end:
            began = time.monotonic()
            # Asking for no more than the range holds lets consume() return as soon as it has them all.
            batch = self.consumer.consume(
                num_messages=min(_BATCH_SIZE, end - self.next), timeout=_POLL_SLICE_S
            )
            before = self.next
            chunk = self._clean(batch)
            if chunk is None:
                chunk = RecordChunk.of(topic, partition, self._checked(batch), headers=headers)
            if chunk.values:
                yield chunk
            idle_s = 0.0 if self.next > before else idle_s + time.monotonic() - began
            if idle_s >= self.options.poll_timeout_s and self.next < end:
                raise self._timeout()

    def _clean(self, batch: list[KafkaMessage]) -> RecordChunk | None:
        """The batch, when it holds the next offsets with no gap and no error event, as most do (None:
        :meth:`_checked` goes through it record by record)."""
        if not batch:
            return None
        first, last = batch[0].offset(), batch[-1].offset()
        if (
            self._elsewhere(batch[0])
            or self._elsewhere(batch[-1])
            or first != self.next
            or last is None
            or last >= self.rng.end
            or last - first != len(batch) - 1
            or any(record.error() is not None for record in batch)
        ):
            return None
        from confluent_kafka import TIMESTAMP_NOT_AVAILABLE

        # Thousands of tuples while the batch's records are alive: the cyclic collector, run every 700
        # allocations, made a timestamp cost 0.7-1.2 µs instead of 0.2. Nothing built here can form
        # a cycle.
        collecting = gc.isenabled()
        gc.disable()
        try:
            offsets = [record.offset() for record in batch]
            if offsets != list(range(first, last + 1)):
                return None
            stamps = [record.timestamp() for record in batch]
            chunk = RecordChunk(
                self.rng.topic,
                self.rng.partition,
                offsets,  # type: ignore[arg-type]
                [record.value() for record in batch],
                [record.key() for record in batch],
                [None if kind == TIMESTAMP_NOT_AVAILABLE else stamp for kind, stamp in stamps],
                [tuple(record.headers() or ()) for record in batch] if self.headers else None,  # type: ignore[arg-type]
            )
        finally:
            if collecting:
                gc.enable()
        self.next = last + 1
        return chunk

    def _checked(self, batch: list[KafkaMessage]) -> list[Message]:
        """The batch's records in the range, after its error events, gaps and lost offsets."""
        from confluent_kafka import TIMESTAMP_NOT_AVAILABLE

        topic, partition, end, headers = self.rng.topic, self.rng.partition, self.rng.end, self.headers
        out: list[Message] = []
        low_checked = False
        for record in batch:
            if self._elsewhere(record):
                continue
            error = record.error()
            if error is not None:
                if self._on_error(error, record):
                    break  # re-positioned: the rest of the batch is stale
                continue
            offset = record.offset()
            if offset is None or offset < self.next:
                continue
            if offset >= end:
                self.next = end
                break
            if offset > self.next and not low_checked:
                low_checked = True  # one watermark query per batch, however many gaps
                if self._watermarks()[0] > self.next:
                    self._lost(self.next, offset)
            kind, timestamp = record.timestamp()
            out.append(
                Message(
                    record.value(),
                    record.key(),
                    topic,
                    partition,
                    offset,
                    None if kind == TIMESTAMP_NOT_AVAILABLE else timestamp,
                    tuple(record.headers() or ()) if headers else (),  # type: ignore[arg-type]
                )
            )
            self.next = offset + 1
        return out

    def _on_error(self, error: KafkaError, record: KafkaMessage) -> bool:
        """Handle an error event; True if the consumer was re-positioned."""
        from confluent_kafka import KafkaError

        code, end = error.code(), self.rng.end
        if code == KafkaError._PARTITION_EOF:
            self.next = max(self.next, min(record.offset() or 0, end))
            if self.next < end and self._watermarks()[1] <= self.next:
                self._lost(self.next, end, "beyond the end of the partition")
                self.next = end
            return False
        if code == KafkaError._AUTO_OFFSET_RESET:
            low, high = self._watermarks()
            if self.next < low:
                self._lost(self.next, min(low, end))
                self.next = min(low, end)
            elif self.next >= high:
                self._lost(self.next, end, "beyond the end of the partition")
                self.next = end
            if self.next < end:
                self._seek(self.next)
            return True
        if code in (
            KafkaError.UNKNOWN_TOPIC_OR_PART,
            KafkaError._UNKNOWN_PARTITION,
            KafkaError._UNKNOWN_TOPIC,
        ):
            self._lost(self.next, end, "the topic or partition does not exist any more")
            self.next = end
            return True
        if error.fatal():
            raise KafkaConnectorError(
                f"{self._where()}: fatal Kafka error: {self.options.client.explain(error)}"
            )
        self.last_error = self.options.client.explain(error)
        return False

    def _elsewhere(self, record: KafkaMessage) -> bool:
        """A record or event of another partition (never expected: a consumer reads one partition at a
        time, and librdkafka drops what an earlier assignment left; not read as this range's if it
        came)."""
        topic, partition = record.topic(), record.partition()
        return (
            topic is not None
            and partition is not None
            and partition >= 0
            and (topic != self.rng.topic or partition != self.rng.partition)
        )

    def _on_client_error(self, error: KafkaError) -> None:
        self.last_error = self.options.client.explain(error)

    def _lost(self, start: int, end: int, why: str = "below the earliest available offset") -> None:
        report_data_loss(
            f"topic '{self.rng.topic}' partition {self.rng.partition}: cannot read offsets [{start}, {end}), "
            f"{why}",
            self.fail_on_data_loss,
        )

    def _seek(self, offset: int) -> None:
        self.partition.offset = offset
        self.consumer.assign([self.partition])

    def _watermarks(self) -> tuple[int, int]:
        from confluent_kafka import KafkaException

        try:
            low, high = self.consumer.get_watermark_offsets(
                self.partition, timeout=self.options.poll_timeout_s, cached=False
            )
        except KafkaException as error:
            raise KafkaConnectorError(
                f"{self._where()}: could not get the partition's watermarks: "
                f"{self.options.client.explain(error)}"
            ) from None
        return low, high

    def _where(self) -> str:
        return (
            f"topic '{self.rng.topic}' partition {self.rng.partition} at offset {self.next} "
            f"(reading [{self.rng.start}, {self.rng.end}) from {self.options.client.bootstrap_servers})"
        )

    def _timeout(self) -> KafkaConnectorError:
        last = f"; last error: {self.last_error}" if self.last_error else ""
        return KafkaConnectorError(
            f"{self._where()}: no records within {self.options.poll_timeout_s:g}s{last}; check that the "
            "brokers are reachable, or raise the source option kafkaConsumer.pollTimeoutMs"
        )


@dataclass(slots=True)
class RecordChunk:
    topic: str
    partition: int
    offsets: list[int]
    values: list[bytes | None]
    keys: list[bytes | None]
    timestamps_ms: list[int | None]
    headers: list[Headers] | None
    """None when the reader did not ask for headers (every record's are then empty)."""

    def __len__(self) -> int:
        return len(self.values)

    @classmethod
    def of(cls, topic: str, partition: int, messages: Sequence[Message], *, headers: bool) -> RecordChunk:
        return cls(
            topic,
            partition,
            [m.offset for m in messages],  # type: ignore[misc]
            [m.value for m in messages],
            [m.key for m in messages],
            [m.timestamp_ms for m in messages],
            [m.headers for m in messages] if headers else None,
        )

    def messages(self) -> list[Message]:
        topic, partition = self.topic, self.partition
        return [
            Message(value, key, topic, partition, offset, timestamp, record_headers)
            for value, key, offset, timestamp, record_headers in zip(
                self.values, self.keys, self.offsets, self.timestamps_ms, self.record_headers(), strict=True
            )
        ]

    def record_headers(self) -> list[Headers]:
        return self.headers if self.headers is not None else [()] * len(self.values)

    def extend(self, other: RecordChunk) -> None:
        if (self.topic, self.partition) != (other.topic, other.partition) or (self.headers is None) != (
            other.headers is None
        ):
            raise ValueError("only chunks of one partition, read with the same headers setting, are joined")
        self.offsets.extend(other.offsets)
        self.values.extend(other.values)
        self.keys.extend(other.keys)
        self.timestamps_ms.extend(other.timestamps_ms)
        if self.headers is not None and other.headers is not None:
            self.headers.extend(other.headers)

    def metadata_array(self, key: str, arrow_type: pa.DataType) -> pa.Array:
        """One metadata column (as :func:`cdcflow.connectors.spark.metadata.metadata_array` gives it)."""
        count = len(self.values)
        if key == "topic":
            return pa.array([self.topic] * count, type=arrow_type)
        if key == "partition":
            return pa.array([self.partition] * count, type=arrow_type)
        if key == "offset":
            return pa.array(self.offsets, type=arrow_type)
        if key == "timestamp":
            return pc.multiply_checked(pa.array(self.timestamps_ms, type=pa.int64()), 1000).cast(arrow_type)
        if key == "key":
            return pa.array(self.keys, type=arrow_type)
        if key == "headers":
            return pa.array(
                [[{"key": n, "value": v} for n, v in h] if h else None for h in self.record_headers()],
                type=arrow_type,
            )
        if key in ("file", "line"):
            return pa.nulls(count, arrow_type)  # a Kafka record is no file's
        raise KeyError(key)


def blocks(chunks: Iterable[RecordChunk], size: int) -> Iterator[RecordChunk]:
    """``chunks`` joined into blocks of about ``size`` records: consecutive chunks of one partition
    are joined while the block stays within ``size``; a chunk is never cut, so one larger than
    ``size`` is a block of its own (a range reader's chunks hold at most 5,000 records)."""
    pending: RecordChunk | None = None
    for chunk in chunks:
        if not chunk.values:
            continue
        if (
            pending is not None
            and len(pending) + len(chunk) <= size
            and (pending.topic, pending.partition) == (chunk.topic, chunk.partition)
            and (pending.headers is None) == (chunk.headers is None)
        ):
            pending.extend(chunk)
            continue
        if pending is not None:
            yield pending
        pending = chunk  # a reader's chunks are its caller's: joined in place
    if pending is not None:
        yield pending
