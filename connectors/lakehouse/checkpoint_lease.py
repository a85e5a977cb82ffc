"""One job per checkpoint: the lease ``ingest`` takes on its checkpoint before its query starts.

Two queries on one checkpoint spoil it: Spark fails the second after its first micro-batch (some 20 s
in) and the message counts its tasks wrote stay in the checkpoint's totals. So a job takes
``<checkpoint>/cdcflow-lease/``: one file per holder, numbered, each written only if absent (an
exclusive create on a local or mounted disk, a conditional put on an object store through Spark's file
system: S3A's If-None-Match, ABFS, GCS), holding the holder's process id, host and a heartbeat renewed
every :data:`HEARTBEAT_S`. A second job finds the newest file live and is refused at once, naming its
holder. A holder that died without letting go (SIGKILL, a lost machine) blocks no restart: its file
is stale as soon as its process is gone (judged on the same host) or once its heartbeat is older than
:data:`STALE_AFTER_S`, and the next job writes the following number. A holder that finds a newer
number than its own was taken over (it stalled past the limit) and fails at its next batch.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cdcflow.connectors.errors import CheckpointInUseError
from cdcflow.connectors.lakehouse.delta.storage import Storage, is_remote, join
from cdcflow.formats.redact import redact

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from cdcflow.connectors.lakehouse.delta.result import BatchApplied

LEASE_DIR = "cdcflow-lease"
HEARTBEAT_S = 10.0
STALE_AFTER_S = 60.0
"""A lease whose heartbeat is older is taken over (the hosts' clocks are assumed to agree within seconds)."""
_NAME = re.compile(r"^(\d+)\.json$")
_ATTEMPTS = 3

log = logging.getLogger("cdcflow.connectors.lakehouse")


class CheckpointLease:
    """The lease of one job on ``checkpoint``: :meth:`take` it before the query starts, :meth:`release`
    it after; :meth:`guard` makes a taken-over lease fail the next micro-batch."""

    def __init__(self, checkpoint: str, storage: Storage) -> None:
        self.checkpoint = checkpoint
        self.storage = storage
        self.directory = join(checkpoint, LEASE_DIR)
        self.number: int | None = None
        self.lost: str | None = None
        self._record: dict[str, Any] = {
            "owner": uuid.uuid4().hex,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "process_started": _process_started(os.getpid()),
            "taken": time.time(),
        }
        self._stop = threading.Event()
        self._beating: threading.Thread | None = None

    def take(self, spark: SparkSession | None = None) -> None:
        """Hold the checkpoint, or raise :class:`CheckpointInUseError` naming the job that does.
        ``spark``: the session whose file system writes a lease on an object store (conditionally)."""
        if self.number is not None:
            return
        for _ in range(_ATTEMPTS):
            newest = self._newest()
            if newest is not None and newest[1] is not None and _stale(newest[1]) is None:
                raise CheckpointInUseError(self._in_use(newest[1]))
            number = newest[0] + 1 if newest is not None else 1
            self._record["heartbeat"] = time.time()
            if self._create(number, spark):
                self.number = number
                self._remove_older(number)
                self._beating = threading.Thread(target=self._beat, name="cdcflow-lease", daemon=True)
                self._beating.start()
                return
        raise CheckpointInUseError(
            f"the checkpoint {redact(self.checkpoint)} was taken by another job starting at the same time; "
            "run one job per checkpoint"
        )

    def release(self) -> None:
        """Let go: stop the heartbeats and mark the lease released (the next job need not wait)."""
        self._stop.set()
        if self._beating is not None:
            self._beating.join()
            self._beating = None
        if self.number is not None and self.lost is None:
            with contextlib.suppress(OSError):
                self._write(self.number, {**self._record, "heartbeat": time.time(), "released": True})
        self.number = None

    def guard(self, on_batch: Callable[[BatchApplied], None] | None) -> Callable[[BatchApplied], None]:
        """``on_batch``, first failing the batch once another job took the lease over."""

        def checked(applied: BatchApplied) -> None:
            if self.lost is not None:
                raise CheckpointInUseError(self.lost)
            if on_batch is not None:
                on_batch(applied)

        return checked

    # --- the files ---------------------------------------------------------------------------------

    def _path(self, number: int) -> str:
        return join(self.directory, f"{number:010d}.json")

    def _numbers(self) -> list[int]:
        found = (_NAME.match(name) for name in self.storage.names(self.directory))
        return sorted(int(match.group(1)) for match in found if match is not None)

    def _newest(self) -> tuple[int, dict[str, Any] | None] | None:
        """The newest lease file's number and record (None: unreadable, so stale)."""
        numbers = self._numbers()
        if not numbers:
            return None
        text = self.storage.read_text(self._path(numbers[-1]))
        try:
            record = json.loads(text) if text else None
        except ValueError:
            record = None
        return numbers[-1], record if isinstance(record, dict) else None

    def _create(self, number: int, spark: SparkSession | None) -> bool:
        """Write lease ``number`` only if no job has: False when one did first."""
        text = json.dumps(self._record)
        path = self._path(number)
        if not is_remote(path):
            return _create_local(path, text)
        if spark is not None:
            from cdcflow.connectors.lakehouse.spark_storage import create_new

            created = create_new(spark, path, text)
            if created is not None:
                return created
        # No conditional put within reach (Spark Connect): two jobs starting in the same instant may
        # both pass; the later one's file wins and the other fails at its first batch.
        if self.storage.exists(path):
            return False
        self.storage.write_text(path, text)
        return True

    def _write(self, number: int, record: dict[str, Any]) -> None:
        path, text = self._path(number), json.dumps(record)
        if is_remote(path):
            self.storage.write_text(path, text)  # one PUT: readers see the old or the new object
        else:
            temporary = f"{path}.{uuid.uuid4().hex}.tmp"
            with open(temporary, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.replace(temporary, path)

    def _remove_older(self, number: int) -> None:
        for older in self._numbers():
            if older < number:
                fs, path = self.storage.filesystem(self._path(older))
                with contextlib.suppress(OSError):
                    fs.delete_file(path)

    def _beat(self) -> None:
        number = self.number
        assert number is not None  # noqa: S101 - beats only while taken
        while not self._stop.wait(HEARTBEAT_S):
            try:
                newest = self._newest()
                if newest is not None and newest[0] > number:
                    self.lost = self._taken_over(newest[1])
                    log.error("cdcflow ingest: %s", self.lost)
                    return
                self._write(number, {**self._record, "heartbeat": time.time()})
            except OSError as error:  # the store is unreachable for a moment: beat again later
                log.warning("cdcflow ingest: could not renew the checkpoint's lease: %s", error)

    # --- messages ----------------------------------------------------------------------------------

    def _in_use(self, record: dict[str, Any]) -> str:
        age = max(0.0, time.time() - float(record.get("heartbeat", 0)))
        return (
            f"the checkpoint {redact(self.checkpoint)} is in use by another job: {_holder(record)}, "
            f"last heartbeat {age:.0f}s ago. Two queries on one checkpoint spoil it: stop that job, or give "
            "this one its own --checkpoint. A job that died without stopping is taken over once its "
            f"process is gone (same host) or after {STALE_AFTER_S:.0f}s without a heartbeat"
        )

    def _taken_over(self, record: dict[str, Any] | None) -> str:
        holder = _holder(record) if record is not None else "another job"
        return (
            f"the checkpoint {redact(self.checkpoint)} was taken over by {holder} after this job renewed no "
            f"heartbeat for {STALE_AFTER_S:.0f}s: stopping; run one job per checkpoint"
        )


def _holder(record: dict[str, Any]) -> str:
    taken = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(record.get("taken", 0))))
    return f"process {record.get('pid')} on host {record.get('host')} (since {taken})"


def _stale(record: dict[str, Any]) -> str | None:
    """Why a lease holds nothing any more (None: its holder is alive)."""
    if record.get("released"):
        return "released"
    pid = record.get("pid")
    if record.get("host") == socket.gethostname() and isinstance(pid, int):
        if not _alive(pid, record.get("process_started")):
            return f"process {pid} is gone"
    age = time.time() - float(record.get("heartbeat", 0))
    return f"no heartbeat for {age:.0f}s" if age > STALE_AFTER_S else None


def _alive(pid: int, started: object) -> bool:
    """Whether process ``pid`` of this host runs, and is the one that started at ``started`` (a pid
    the system gave to a new process after the holder died is not the holder; a zombie is dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    state = _process_state(pid)
    if state is None:
        return True  # no /proc to ask: it exists
    return state[0] != "Z" and (started is None or state[1] == started)


def _process_started(pid: int) -> str | None:
    """When process ``pid`` started, in clock ticks since boot (Linux ``/proc``; None elsewhere)."""
    state = _process_state(pid)
    return state[1] if state is not None else None


def _process_state(pid: int) -> tuple[str, str] | None:
    """Process ``pid``'s state letter and start time from Linux's ``/proc/<pid>/stat``."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            fields = handle.read().rpartition(")")[2].split()
    except OSError:
        return None
    return (fields[0], fields[19]) if len(fields) > 19 else None


def _create_local(path: str, text: str) -> bool:
    """Write ``path`` whole, only if absent (a hard link is created atomically or not at all)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temporary = f"{path}.{uuid.uuid4().hex}.tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(text)
    try:
        os.link(temporary, path)
    except FileExistsError:
        return False
    finally:
        os.remove(temporary)
    return True
