"""Recorded topics: read dump files and plain files of messages as if they came from Kafka.

Two kinds of file are read (``docs/replay.md``):

- a **topic dump**: JSON Lines whose first line is ``{"cdcflow-topic-dump":1}``, then one record per
  line with its topic, partition, offset, timestamp, key, value and headers (bytes as base64);
- a **plain file**: one message value per line (e.g. one Debezium envelope), blank lines ignored.

Files split by byte range: a split owns the lines that *start* in ``[start, end)``, so any set of
adjacent splits reads every line exactly once. Messages carry their file and 1-based line number;
the planner counts the lines before each split once (:func:`lines_before_splits`) and hands the count
to the split, which never rescans the file from its start.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import glob
import os
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import IO, Any

import orjson

from cdcflow.connectors.errors import ConnectorOptionError, ReplayFormatError
from cdcflow.connectors.kafka import admin as kafka_admin
from cdcflow.connectors.kafka import offsets as kafka_offsets
from cdcflow.connectors.kafka import reader as kafka_reader
from cdcflow.connectors.kafka.options import KafkaOptions
from cdcflow.formats import Message
from cdcflow.formats.redact import redact

DUMP_MARKER = "cdcflow-topic-dump"
DUMP_VERSION = 1
DUMP_HEADER = orjson.dumps({DUMP_MARKER: DUMP_VERSION}) + b"\n"
_RECORD_KEYS = frozenset({"topic", "partition", "offset", "timestamp", "key", "value", "headers"})
_GLOB_CHARS = frozenset("*?[")
_CHUNK = 1 << 20


def list_files(path: str) -> list[str]:
    """The files ``path`` names: itself, a directory's files (sorted, not recursive) or a glob's matches.

    Hidden files (names starting with ``.`` or ``_``, as Spark skips them) are left out.
    """
    if _GLOB_CHARS & set(path):
        files = sorted(p for p in glob.glob(path, recursive=True) if os.path.isfile(p) and not _hidden(p))
    elif os.path.isdir(path):
        files = sorted(
            os.path.join(path, name)
            for name in os.listdir(path)
            if not _hidden(name) and os.path.isfile(os.path.join(path, name))
        )
    elif os.path.isfile(path):
        return [path]
    else:
        raise ConnectorOptionError(
            f"path '{redact(path)}' does not exist: give a file, a directory or a glob"
        )
    if not files:
        raise ConnectorOptionError(
            f"path '{redact(path)}' names no file to replay (hidden files are skipped)"
        )
    return files


def _hidden(path: str) -> bool:
    return os.path.basename(path).startswith((".", "_"))


def file_size(path: str) -> int:
    return os.path.getsize(path)


def read_messages(
    path: str, start_byte: int = 0, end_byte: int | None = None, lines_before: int | None = None
) -> Iterator[Message]:
    """The messages of the lines of ``path`` that start in ``[start_byte, end_byte)``, in file order.

    ``lines_before`` is the number of lines before the first of them, when the planner counted it
    (:func:`lines_before_splits`); else it is counted here.
    """
    with open(path, "rb") as stream:
        dump = _is_dump(stream, path)
        position = _line_start_at(stream, start_byte)
        number = _count_lines(path, stream, position) if lines_before is None else lines_before
        stream.seek(position)
        end = file_size(path) if end_byte is None else end_byte
        while position < end:
            line = stream.readline()
            if not line:
                return
            position += len(line)
            number += 1
            if not line.strip() or (dump and number == 1):
                continue
            if dump:
                yield _dump_record(line, path, number)
            else:
                yield Message(line.rstrip(b"\r\n"), file=path, line=number)


def read_line_chunks(
    path: str, start_byte: int = 0, end_byte: int | None = None, chunk_bytes: int = 4 << 20
) -> Iterator[tuple[int, bytes]]:
    """Whole lines of a plain file starting in ``[start_byte, end_byte)``, in chunks of about
    ``chunk_bytes``: ``(byte position of the chunk, the lines' bytes)``, for columnar decoders."""
    with open(path, "rb") as stream:
        position = _line_start_at(stream, start_byte)
        end = file_size(path) if end_byte is None else end_byte
        while position < end:
            chunk = stream.read(min(chunk_bytes, end - position))
            if not chunk:
                return
            if not chunk.endswith(b"\n"):
                chunk += stream.readline()  # the line that starts in the range ends after it
            yield position, chunk
            position += len(chunk)


def lines_before(path: str, position: int) -> int:
    """How many lines of ``path`` end before byte ``position``."""
    with open(path, "rb") as stream:
        return _count_lines(path, stream, position)


def lines_before_splits(path: str, starts: Sequence[int]) -> list[int]:
    """For each split start, how many lines of ``path`` end before the split's first line.

    The newlines are counted once: from the nearest position counted before (in this process, while
    the file keeps its size and modification time or only grows), so planning every split of a file
    and of its successive micro-batches reads each byte about once.
    """
    with open(path, "rb") as stream:
        return [_count_lines(path, stream, _line_start_at(stream, start)) for start in starts]


def next_line_start(path: str, position: int) -> int:
    """The byte position of the first line of ``path`` starting at or after ``position`` (or its end)."""
    with open(path, "rb") as stream:
        return _line_start_at(stream, position)


@dataclass
class _Counted:
    """Positions of one file whose preceding newlines are known: ``(byte position, newlines before)``."""

    size: int
    mtime_ns: int
    marks: list[tuple[int, int]] = dataclass_field(default_factory=lambda: [(0, 0)])


_COUNTED: dict[str, _Counted] = {}
_COUNTED_LOCK = threading.Lock()
_MAX_MARKS = 256
_MAX_FILES = 4096


def _count_lines(path: str, stream: IO[bytes], position: int) -> int:
    """The newlines of ``stream`` (the file ``path``) before ``position``, counted from the nearest
    known position before it, which becomes known in turn."""
    stat = os.fstat(stream.fileno())
    with _COUNTED_LOCK:
        counted = _COUNTED.get(path)
        if (
            counted is None
            or stat.st_size < counted.size
            or (stat.st_size == counted.size and stat.st_mtime_ns != counted.mtime_ns)
        ):
            counted = _Counted(stat.st_size, stat.st_mtime_ns)  # new, shrunk or rewritten: count again
        else:  # the same file, or grown: replayed files only grow, positions counted hold
            counted.size, counted.mtime_ns = stat.st_size, stat.st_mtime_ns
        _COUNTED.pop(path, None)
        _COUNTED[path] = counted  # most recently used last
        if len(_COUNTED) > _MAX_FILES:
            del _COUNTED[next(iter(_COUNTED))]
        at = bisect.bisect_right(counted.marks, (position, float("inf"))) - 1
        known, lines = counted.marks[at]
    lines += _newlines_between(stream, known, position)
    with _COUNTED_LOCK:
        marks = counted.marks
        index = bisect.bisect_left(marks, (position, -1))
        if index == len(marks) or marks[index][0] != position:
            marks.insert(index, (position, lines))
        if len(marks) > _MAX_MARKS:
            del marks[1 : len(marks) - _MAX_MARKS + 1]  # keep the start and the furthest positions
    return lines


def _newlines_between(stream: IO[bytes], start: int, end: int) -> int:
    stream.seek(start)
    lines, read = 0, start
    while read < end:
        chunk = stream.read(min(_CHUNK, end - read))
        if not chunk:
            break
        lines += chunk.count(b"\n")
        read += len(chunk)
    return lines


def _line_start_at(stream: IO[bytes], start: int) -> int:
    """Move to the first line starting at or after ``start``; returns its byte position."""
    if start <= 0:
        stream.seek(0)
        return 0
    stream.seek(start - 1)
    position = start - 1 + len(stream.readline())  # the rest of the line that started before
    stream.seek(position)
    return position


def is_dump(path: str) -> bool:
    """Whether ``path`` is a topic dump (its first line is the dump header)."""
    with open(path, "rb") as stream:
        return _is_dump(stream, path)


def _is_dump(stream: IO[bytes], path: str) -> bool:
    stream.seek(0)
    first = stream.readline(4096)
    if DUMP_MARKER.encode() not in first:
        return False
    try:
        header = orjson.loads(first)
    except orjson.JSONDecodeError:
        raise ReplayFormatError(
            f"{path}:1: looks like a cdcflow topic dump header but is not valid JSON; write "
            f"{DUMP_HEADER.decode().strip()} on the first line"
        ) from None
    if not isinstance(header, dict) or DUMP_MARKER not in header:
        return False
    if header[DUMP_MARKER] != DUMP_VERSION:
        raise ReplayFormatError(
            f"{path}:1: topic dump version {header[DUMP_MARKER]!r} is not supported; this cdcflow reads "
            f"version {DUMP_VERSION}"
        )
    return True


def _dump_record(line: bytes, path: str, number: int) -> Message:
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError as error:
        raise ReplayFormatError(
            f"{path}:{number}: not valid JSON ({error}); each dump line holds one record"
        ) from None
    try:
        # The common case, checked without building anything; _invalid explains any failure.
        if type(record) is dict and record.keys() <= _RECORD_KEYS:
            topic, partition, offset = record["topic"], record["partition"], record["offset"]
            timestamp = record.get("timestamp")
            if (
                type(topic) is str
                and topic
                and type(partition) is int
                and partition >= 0
                and type(offset) is int
                and offset >= 0
                and (timestamp is None or type(timestamp) is int)
            ):
                headers = record.get("headers", [])
                if type(headers) is not list:
                    raise TypeError("headers are a list")
                return Message(
                    _unbase64(record["value"]),
                    _unbase64(record.get("key")),
                    topic,
                    partition,
                    offset,
                    timestamp,
                    tuple(map(_header, headers)) if headers else (),
                    path,
                    number,
                )
    except (KeyError, TypeError, ValueError):  # binascii.Error is a ValueError
        pass
    raise _invalid(record, f"{path}:{number}")


def _unbase64(text: str | None) -> bytes | None:
    return None if text is None else binascii.a2b_base64(text, strict_mode=True)


def _header(pair: Any) -> tuple[str, bytes | None]:
    if type(pair) is not list or len(pair) != 2 or type(pair[0]) is not str:
        raise TypeError("a header is a [name, base64-or-null] pair")
    return pair[0], _unbase64(pair[1])


def _invalid(record: Any, where: str) -> ReplayFormatError:
    """What is wrong with a record the fast path refused."""
    if not isinstance(record, dict):
        return ReplayFormatError(f"{where}: expected a record object, got {type(record).__name__}")
    unknown = set(record) - _RECORD_KEYS
    missing = {"topic", "partition", "offset", "value"} - set(record)
    if unknown or missing:
        return ReplayFormatError(
            f"{where}: a record has the keys topic, partition, offset, value and optionally timestamp, key, "
            f"headers; missing: {_names(missing)}, unknown: {_names(unknown)}"
        )
    topic, timestamp = record["topic"], record.get("timestamp")
    if not isinstance(topic, str) or not topic:
        return ReplayFormatError(f"{where}: 'topic' must be a topic name, got {topic!r}")
    for name in ("partition", "offset"):
        value = record[name]
        if type(value) is not int or value < 0:
            return ReplayFormatError(f"{where}: '{name}' must be an integer >= 0, got {value!r}")
    if timestamp is not None and type(timestamp) is not int:
        return ReplayFormatError(f"{where}: 'timestamp' must be milliseconds (an integer) or null")
    headers = record.get("headers", [])
    if not isinstance(headers, list) or not all(
        isinstance(h, list) and len(h) == 2 and isinstance(h[0], str) for h in headers
    ):
        return ReplayFormatError(f"{where}: 'headers' must be a list of [name, base64-or-null] pairs")
    fields = [("value", record["value"]), ("key", record.get("key"))]
    for field, text in fields + [(f"header '{name}'", value) for name, value in headers]:
        if text is not None and not isinstance(text, str):
            return ReplayFormatError(
                f"{where}: '{field}' must be base64 text or null, got {type(text).__name__}"
            )
        try:
            _unbase64(text)
        except (binascii.Error, ValueError):
            return ReplayFormatError(f"{where}: '{field}' is not valid base64")
    return ReplayFormatError(f"{where}: not a valid dump record")


def _names(keys: set[str]) -> str:
    return ", ".join(sorted(keys)) or "none"


# --- writing -------------------------------------------------------------------------------------


def dump_line(message: Message) -> bytes:
    """One dump record, without the newline; keys in a fixed order, so equal messages give equal bytes."""
    if message.topic is None or message.partition is None or message.offset is None:
        raise ReplayFormatError(
            f"cannot record {message.origin()} in a topic dump: it needs its topic, partition and offset"
        )
    return orjson.dumps(
        {
            "topic": message.topic,
            "partition": message.partition,
            "offset": message.offset,
            "timestamp": message.timestamp_ms,
            "key": _b64(message.key),
            "value": _b64(message.value),
            "headers": [[name, _b64(value)] for name, value in message.headers],
        }
    )


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


class DumpWriter:
    """Writes a topic dump; the file appears at ``path`` only when the writer closes without error."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._partial = self.path.with_name(f".{self.path.name}.{os.getpid()}.partial")
        self._stream: IO[bytes] = open(self._partial, "wb")  # noqa: SIM115 - closed in close()/abort()
        self._stream.write(DUMP_HEADER)
        self.records = 0

    def write(self, message: Message) -> None:
        self._stream.write(dump_line(message) + b"\n")
        self.records += 1

    def close(self) -> None:
        self._stream.close()
        os.replace(self._partial, self.path)

    def abort(self) -> None:
        self._stream.close()
        self._partial.unlink(missing_ok=True)

    def __enter__(self) -> DumpWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()


def write_dump(path: str | Path, messages: Iterable[Message]) -> int:
    """Write ``messages`` as a topic dump; the number written."""
    with DumpWriter(path) as writer:
        for message in messages:
            writer.write(message)
        return writer.records


@dataclass(frozen=True)
class RecordSummary:
    path: str
    records: int
    partitions: int
    topics: tuple[str, ...]

    def __str__(self) -> str:
        return (
            f"recorded {self.records} records from {self.partitions} partitions of "
            f"{', '.join(self.topics) or 'no topic'} to {self.path}"
        )


def record_topic(options: KafkaOptions | Mapping[str, str], output: str | Path) -> RecordSummary:
    """Dump the partitions of a subscription from startingOffsets (default earliest) up to endingOffsets
    (default the high watermarks when the recording starts), ordered by topic, partition and offset."""
    opts = options if isinstance(options, KafkaOptions) else KafkaOptions.parse(options)
    bounds = kafka_admin.subscription_bounds(opts)
    start = kafka_offsets.resolve_offsets(opts.offsets_for("starting", "batch"), bounds, which="starting")
    end = kafka_offsets.resolve_offsets(opts.offsets_for("ending", "batch"), bounds, which="ending")
    ranges = kafka_offsets.batch_ranges(start, end)
    messages = (
        message for rng in ranges for message in kafka_reader.read_range(opts, rng, include_headers=True)
    )
    records = write_dump(output, messages)
    return RecordSummary(str(output), records, len(bounds), tuple(sorted({tp.topic for tp in bounds})))
