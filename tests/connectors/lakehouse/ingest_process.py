"""Watching an ingest job run as its own process group: progress, SIGKILL, and that it is gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

_LOGS: dict[int, Path] = {}
"""The output file of each job :func:`start_ingest` started, by process id."""


def start_ingest(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """``python -m cdcflow ingest ARGS`` in a session of its own (so a SIGKILL of its group reaches
    the JVM too), its output in ``log``."""
    with log.open("wb") as out:
        job = subprocess.Popen(  # noqa: S603 - our own command, fixed arguments
            [sys.executable, "-m", "cdcflow", "ingest", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    _LOGS[job.pid] = log
    return job


def tail(log: Path, lines: int = 20) -> str:
    return "\n".join(log.read_text(errors="replace").strip().splitlines()[-lines:])


def wait_for(
    job: subprocess.Popen[bytes],
    timeout: float,
    target: Path | Callable[[], int] | None = None,
    version: int = 0,
) -> None:
    """Until the job exits or, given a target (a local table, or a function giving its version, polled
    less often), the table reaches ``version``. The job fails once it makes no progress for ``timeout``
    seconds: its output does not grow (a line per applied batch) and the table's version does not move.
    A slow machine only takes longer; a job that hangs fails."""
    current = target if callable(target) else None if target is None else partial(table_version, target)
    pause = 0.05 if callable(target) else 0.002
    log = _LOGS.get(job.pid)
    seen: tuple[int, int] | None = None
    deadline = time.monotonic() + timeout
    while job.poll() is None:
        reached = current() if current is not None else -1
        if current is not None and reached >= version:
            return
        now = (reached, log.stat().st_size if log is not None and log.exists() else 0)
        if now != seen:
            seen, deadline = now, time.monotonic() + timeout
        elif time.monotonic() > deadline:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
            output = f": {tail(log)}" if log is not None else ""
            pytest.fail(f"the ingestion made no progress in {timeout:.0f} s{output}")
        time.sleep(pause)


def wait_session_gone(session: int) -> None:
    """The killed group (driver, JVM) and the Python workers the JVM started in groups of their own
    (same session) are gone, zombies aside: no second writer or reader outlives the kill."""
    deadline = time.monotonic() + 10
    while live_members(session):
        assert time.monotonic() < deadline, f"processes {live_members(session)} outlived SIGKILL"
        time.sleep(0.05)


def live_members(session: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state, _, _, sid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:4]
        except OSError:
            continue
        if int(sid) == session and state != "Z":
            members.append(int(entry.name))
    return members


def table_version(path: Path) -> int:
    log = path / "_delta_log"
    if not log.is_dir():
        return -1
    return max((int(p.stem) for p in log.glob("*.json") if p.stem.isdigit()), default=-1)
