"""What became of every message a read took: one counts file per input range, summed by the driver.

Spark 4's Python data sources cannot report custom metrics (``DataSourceReader`` and
``DataSourceStreamReader`` have no metrics hook, so a query's progress shows only Spark's own
``numInputRows``), so each task writes its range's counts to ``accountingPath`` when it ends: a file
named for the range (:func:`range_name`), written under a temporary name and renamed into place, so a
retried task or a restarted micro-batch replaces it instead of adding to it.

The files of micro-batches Spark has committed are rolled up (:func:`roll_up`) into one ``totals.json``
and deleted, so the directory of a long-running query stays small.
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, fields, replace

import orjson

from cdcflow.formats.base import FormatMetrics

COUNTS_PREFIX = "counts-"
TOTALS = "totals.json"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def range_name(topic_or_path: str, partition: int | None, start: int, end: int) -> str:
    """A file-name-safe name for the input range ``[start, end)``: of a Kafka partition
    (``topic-3-100-200``) or of a recorded file's bytes (``name.jsonl-<hash of its path>-0-4096``)."""
    if partition is not None:
        return f"{_UNSAFE.sub('_', topic_or_path)}-{partition}-{start}-{end}"
    digest = hashlib.sha256(os.path.abspath(topic_or_path).encode()).hexdigest()[:12]
    return f"{_UNSAFE.sub('_', os.path.basename(topic_or_path))}-{digest}-{start}-{end}"


def attempt_suffix() -> str:
    """A temporary name's suffix unique to this task attempt (speculative attempts run side by side)."""
    attempt = 0
    try:
        from pyspark import TaskContext

        context = TaskContext.get()
        attempt = context.attemptNumber() if context is not None else 0
    except ImportError:  # pragma: no cover - the connectors run inside Spark
        pass
    return f"attempt-{attempt}-{uuid.uuid4().hex[:12]}"


def publish(temporary: str, final: str) -> None:
    """Move a finished file into place atomically; a file of the same range is replaced."""
    with open(temporary, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(temporary, final)


def discard(temporary: str) -> None:
    try:
        os.remove(temporary)
    except FileNotFoundError:
        pass


@dataclass
class MessageCounts:
    """Every message read lands in exactly one of the outcome counters, so they add up to ``read``.

    ``changes`` counts changelog rows (an update is two); ``changed`` the messages they came from.
    """

    read: int = 0
    changed: int = 0
    changes: int = 0
    dead_letters: int = 0
    control_events: int = 0
    filtered: int = 0
    tombstones: int = 0
    empty: int = 0
    internal_errors: int = 0
    """Of the dead letters, those a cdcflow bug made (not part of :meth:`accounted`)."""

    @classmethod
    def of(cls, metrics: FormatMetrics) -> MessageCounts:
        return cls(
            read=metrics.messages,
            changed=metrics.changed_messages,
            changes=metrics.changes,
            dead_letters=metrics.dead_letters,
            control_events=metrics.events,
            filtered=metrics.filtered,
            tombstones=metrics.tombstones,
            empty=metrics.empty,
            internal_errors=metrics.internal_errors,
        )

    def accounted(self) -> int:
        return (
            self.changed
            + self.dead_letters
            + self.control_events
            + self.filtered
            + self.tombstones
            + self.empty
        )

    def add(self, other: MessageCounts) -> None:
        for item in fields(self):
            setattr(self, item.name, getattr(self, item.name) + getattr(other, item.name))

    def __str__(self) -> str:
        text = (
            f"{self.read:,} messages read: {self.changed:,} with changes ({self.changes:,} rows), "
            f"{self.dead_letters:,} dead letter(s) ({self.internal_errors:,} internal errors), "
            f"{self.control_events:,} control event(s), "
            f"{self.filtered:,} filtered, {self.tombstones:,} tombstone(s), {self.empty:,} empty"
        )
        missing = self.read - self.accounted()
        return text if missing == 0 else f"{text}; {missing:,} UNACCOUNTED (a cdcflow bug: please report)"


def write_counts(directory: str, name: str, counts: MessageCounts) -> None:
    """Write one range's counts (``counts-<range>.json``), replacing an earlier attempt's."""
    os.makedirs(directory, exist_ok=True)
    final = os.path.join(directory, f"{COUNTS_PREFIX}{name}.json")
    temporary = os.path.join(directory, f".{COUNTS_PREFIX}{name}.{attempt_suffix()}.tmp")
    with open(temporary, "wb") as handle:
        handle.write(orjson.dumps({"range": name, **counts.__dict__}))
    publish(temporary, final)


def count_files(directory: str) -> dict[str, int]:
    """The counts files under ``directory`` and their modification times (none if it is missing)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return {}
    stamps: dict[str, int] = {}
    for name in names:
        if name.startswith(COUNTS_PREFIX) and name.endswith(".json"):
            try:
                stamps[name] = os.stat(os.path.join(directory, name)).st_mtime_ns
            except FileNotFoundError:  # replaced in the meantime: seen next time
                continue
    return stamps


def _read_file(path: str) -> MessageCounts | None:
    try:
        with open(path, "rb") as handle:
            record = orjson.loads(handle.read())
    except FileNotFoundError:
        return None
    known = {f.name for f in fields(MessageCounts)}
    return MessageCounts(**{k: int(v) for k, v in record.items() if k in known})


def read_totals(directory: str) -> tuple[MessageCounts, dict[str, int]]:
    """The rolled-up counts (zero before the first roll-up) and the counts files (with their
    modification times) the last roll-up added to them."""
    try:
        with open(os.path.join(directory, TOTALS), "rb") as handle:
            record = orjson.loads(handle.read())
    except FileNotFoundError:
        return MessageCounts(), {}
    known = {f.name for f in fields(MessageCounts)}
    rolled = {str(name): int(stamp) for name, stamp in record.get("rolled", {}).items()}
    return MessageCounts(**{k: int(v) for k, v in record.items() if k in known}), rolled


def read_counts(directory: str, names: Iterable[str] | None = None) -> MessageCounts:
    """The counts of the messages read into ``directory``: its rolled-up totals plus its counts files
    (or only the counts files ``names``)."""
    if names is not None:
        total = MessageCounts()
        for name in sorted(names):
            counts = _read_file(os.path.join(directory, name))
            if counts is not None:
                total.add(counts)
        return total
    total, rolled = read_totals(directory)
    stamps = count_files(directory)
    total.add(read_counts(directory, [n for n, t in stamps.items() if rolled.get(n) != t]))
    return total


def last_commit_time(checkpoint: str) -> int | None:
    """The modification time (ns) of Spark's commit file of the last committed micro-batch."""
    commits = os.path.join(checkpoint, "commits")
    try:
        batches = [int(name) for name in os.listdir(commits) if name.isdigit()]
    except FileNotFoundError:
        return None
    for batch in sorted(batches, reverse=True):
        try:
            return os.stat(os.path.join(commits, str(batch))).st_mtime_ns
        except FileNotFoundError:  # purged in the meantime
            continue
    return None


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def roll_up(directory: str, checkpoint: str) -> dict[str, tuple[int, MessageCounts]]:
    """Add the counts files of committed micro-batches to ``totals.json`` and delete them; returns
    them (name: modification time, counts).

    Spark writes ``<checkpoint>/commits/<N>`` once every task of batch N has written its counts and
    never runs a committed batch again, so a file older than the last commit file is final. (Strictly
    older: a file of the next batch may share the commit file's clock tick, and that batch, if the
    query stops before committing it, rewrites the file when it runs again.) ``totals.json`` names
    the files it has just added, so that if the deletes do not happen, the next roll-up deletes
    them without adding them again.
    """
    committed = last_commit_time(checkpoint)
    if committed is None:
        return {}
    totals, rolled_before = read_totals(directory)
    stamps = count_files(directory)
    for name, stamp in rolled_before.items():
        if stamps.get(name) == stamp:
            _remove(os.path.join(directory, name))
            del stamps[name]
    rolled: dict[str, tuple[int, MessageCounts]] = {}
    for name, stamp in sorted(stamps.items()):
        if stamp < committed:
            counts = _read_file(os.path.join(directory, name))
            if counts is not None:
                rolled[name] = (stamp, counts)
                totals.add(counts)
    if rolled:
        record = {**totals.__dict__, "rolled": {name: stamp for name, (stamp, _) in rolled.items()}}
        temporary = os.path.join(directory, f".{TOTALS}.{uuid.uuid4().hex[:12]}.tmp")
        with open(temporary, "wb") as handle:
            handle.write(orjson.dumps(record))
        publish(temporary, os.path.join(directory, TOTALS))
        for name in rolled:
            _remove(os.path.join(directory, name))
        for name in os.listdir(directory):  # temporary files of task attempts that never finished
            if name.startswith(f".{COUNTS_PREFIX}") and name.endswith(".tmp"):
                path = os.path.join(directory, name)
                try:
                    stale = os.stat(path).st_mtime_ns < committed
                except FileNotFoundError:
                    continue
                if stale:
                    _remove(path)
    return rolled


class CountsSince:
    """The counts of the ranges a run wrote: files new or rewritten since it started, including those
    rolled up since (with a ``checkpoint``, its committed files are rolled up first, then whenever the
    counts are read)."""

    def __init__(self, directory: str, checkpoint: str | None = None) -> None:
        self.directory = directory
        self.checkpoint = checkpoint
        if checkpoint is not None:
            roll_up(directory, checkpoint)
        self._before = count_files(directory)
        self._rolled = MessageCounts()

    def committed(self) -> MessageCounts:
        """The counts of the micro-batches Spark committed (with a ``checkpoint``; else none): unlike
        :meth:`counts`, not those of a batch in progress, whose tasks wrote theirs already."""
        if self.checkpoint is not None:
            for name, (stamp, counts) in roll_up(self.directory, self.checkpoint).items():
                if self._before.get(name) != stamp:
                    self._rolled.add(counts)
        return replace(self._rolled)

    def counts(self) -> MessageCounts:
        self.committed()
        now = count_files(self.directory)
        total = read_counts(self.directory, [n for n, t in now.items() if self._before.get(n) != t])
        total.add(self._rolled)
        return total
