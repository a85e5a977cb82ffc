r"""The command line run in the test's own process: ``cdcflow.cli.main(argv)`` instead of a child
``python -m cdcflow`` (a new Python and, for stream and ingest, a new Spark JVM per command).

:func:`run_cli_in_process` returns what ``subprocess.run(..., capture_output=True, text=True)`` returns
(exit code, stdout, stderr), so a test's assertions read the same either way. What a child process would
start fresh is made so for the run and put back after it:

- ``sys.stdout`` / ``sys.stderr`` / ``sys.stdin`` (stdin empty unless given, as ``stdin=DEVNULL``); the
  output's line ends read as ``text=True`` reads a pipe (``\r\n`` and ``\r`` are ``\n``);
- the ``logging`` set-up the command makes (its ``cdcflow: ...`` handler on the stderr of this run, the
  levels it sets on the Kafka and Py4J loggers, a root handler as in a process without one);
- the SIGINT handler and the current directory;
- an exit through ``SystemExit`` (argparse) is its code; an exception the command lets out is the
  traceback on stderr and exit code 1, as the interpreter makes of it;
- a run that outlasts ``timeout`` raises :class:`subprocess.TimeoutExpired`, as ``subprocess.run`` does
  (its streaming queries are stopped and the main thread interrupted, so it returns).

``stream`` and ``ingest`` run on the test session's SparkSession (the ``spark`` fixture: pass it, which
also makes the test a ``spark`` one), which the command finds active and uses as it is; after the run
the session must still be running (a command stops only a session it started), streaming queries the
run left active are stopped, and the session's SQL confs are put back. What the JVM writes to the
process's fd 2 is not in ``stderr`` here: a test about JVM noise or stack traces on the real stderr runs
a child process.
"""

from __future__ import annotations

import contextlib
import io
import logging
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SPARK_COMMANDS = frozenset({"stream", "ingest"})


def run_cli_in_process(
    *args: str,
    spark: SparkSession | None = None,
    stdin: str | None = None,
    cwd: str | Path | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    """``cdcflow ARGS`` through :func:`cdcflow.cli.main` in this process; ``spark`` (the session fixture)
    is required by ``stream`` and ``ingest``."""
    from cdcflow.cli import main

    if args and args[0] in SPARK_COMMANDS and spark is None:
        raise TypeError(f"in-process, `{args[0]}` runs on the test session's SparkSession: pass spark=spark")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.ExitStack() as stack:
        stack.enter_context(_kept_logging())
        stack.enter_context(_kept_sigint())
        if spark is not None:
            stack.enter_context(_kept_session(spark))
        if cwd is not None:
            stack.enter_context(contextlib.chdir(cwd))
        stack.enter_context(_stdin(stdin or ""))
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        expired = stack.enter_context(_watchdog(timeout, spark))
        code = _exit_code(main, list(args))
    command = [sys.executable, "-m", "cdcflow", *args]
    stdout, stderr = _as_text(out.getvalue()), _as_text(err.getvalue())
    if expired.is_set():
        raise subprocess.TimeoutExpired(command, timeout, stdout, stderr)
    return subprocess.CompletedProcess(command, code, stdout, stderr)


def _as_text(written: str) -> str:
    """What ``subprocess.run(..., text=True)`` reads of ``written``: universal newlines."""
    return written.replace("\r\n", "\n").replace("\r", "\n")


def _exit_code(main: Any, argv: list[str]) -> int:
    try:
        return int(main(argv))
    except SystemExit as exited:  # argparse: a usage error (2) or --help (0)
        if exited.code is None or isinstance(exited.code, int):
            return exited.code or 0
        print(exited.code, file=sys.stderr)
        return 1
    except Exception:  # what the interpreter prints of an exception nobody caught
        traceback.print_exc()
        return 1


@contextlib.contextmanager
def _watchdog(timeout: float, spark: SparkSession | None) -> Iterator[threading.Event]:
    """After ``timeout`` seconds: the event set, the queries the run started stopped (a query's wait
    returns) and the main thread interrupted (KeyboardInterrupt: the command returns 130)."""
    import _thread

    expired = threading.Event()
    running = {query.id for query in spark.streams.active} if spark is not None else set()

    def expire() -> None:
        expired.set()
        if spark is not None:
            for query in spark.streams.active:
                if query.id not in running:
                    with contextlib.suppress(Exception):
                        query.stop()
        _thread.interrupt_main()

    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    timer.start()
    try:
        yield expired
    finally:
        timer.cancel()


@contextlib.contextmanager
def _stdin(text: str) -> Iterator[None]:
    previous = sys.stdin
    sys.stdin = io.TextIOWrapper(io.BytesIO(text.encode("utf-8")), encoding="utf-8")
    try:
        yield
    finally:
        sys.stdin = previous


@contextlib.contextmanager
def _kept_sigint() -> Iterator[None]:
    previous = signal.getsignal(signal.SIGINT)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def _kept_logging() -> Iterator[None]:
    """The loggers as a new process has them while the command runs (no handler on the root and on
    ``cdcflow``, which the command adds on this run's stderr), and as they were after it."""
    manager = logging.Logger.manager
    loggers = [logging.root, *(lg for lg in manager.loggerDict.values() if isinstance(lg, logging.Logger))]
    saved = {lg: (lg.level, list(lg.handlers), lg.propagate, lg.disabled) for lg in loggers}
    cdcflow = logging.getLogger("cdcflow")
    logging.root.handlers = []  # pytest's capture handlers: a process of its own has none
    logging.root.setLevel(logging.WARNING)
    cdcflow.handlers = []
    cdcflow.propagate = True
    try:
        yield
    finally:
        for lg in [logging.root, *manager.loggerDict.values()]:
            if not isinstance(lg, logging.Logger):
                continue
            if lg in saved:
                lg.level, lg.handlers, lg.propagate, lg.disabled = saved[lg]
            else:  # a logger the command made: as it would be without the command's settings
                lg.handlers, lg.level, lg.propagate = [], logging.NOTSET, True
        logging.Logger.manager._clear_cache()


@contextlib.contextmanager
def _kept_session(spark: SparkSession) -> Iterator[None]:
    """``spark`` stays the session's: not stopped (the command's own promise, checked), its SQL confs as
    before, no query left running."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is None or not active._jsparkSession.equals(spark._jsparkSession):
        raise AssertionError("the test session's SparkSession is not the active one: the CLI would start one")
    confs = dict(spark.conf.getAll)
    running = {query.id for query in spark.streams.active}
    try:
        yield
    finally:
        # The CLI leaves a session it did not start running (a notebook's stays usable).
        assert not spark.sparkContext._jsc.sc().isStopped(), "the command stopped the caller's session"
        for query in spark.streams.active:
            if query.id not in running:
                query.stop()
        now = dict(spark.conf.getAll)
        for key in now.keys() - confs.keys():
            spark.conf.unset(key)
        for key, value in confs.items():
            if now.get(key) != value and spark.conf.isModifiable(key):
                spark.conf.set(key, value)
