import logging
import os
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from jvm_options import use_quick_jvms

# Test helper modules (tests/core/helpers.py, ...) import as plain modules.
sys.path.insert(0, str(Path(__file__).parent / "core"))

# An exception that is not a record's fault (a bug in a format) is raised, not dead-lettered: tests
# never hide one (docs/formats.md, "Error handling"). Set before any SparkSession: executors inherit it.
os.environ.setdefault("CDCFLOW_STRICT_DECODE", "1")

KINDS = ("unit", "spark", "process")
"""Every test is one kind (docs/testing.md, "Kinds of tests"): ``unit`` starts no JVM, ``spark`` uses the
session's one SparkSession, ``process`` starts child processes (a broker, PostgreSQL, Connect, a cluster,
an S3 server, ``python -m cdcflow``)."""

SERVICES = {
    "stack": frozenset({"stack_bootstrap", "postgres", "connect_worker"}),
    "cluster": frozenset({"standalone", "connect_server"}),
    "brokers": frozenset({"kafka_cluster"}),
    "s3": frozenset({"s3_server", "s3_bucket", "s3_spark"}),
}
"""Session services by the fixtures that start them. Under pytest-xdist (scripts/test.sh) the tests of the
stack (PostgreSQL and Connect) and of the standalone cluster each run on one worker, which starts those
services once; every worker starts its own broker, S3 server and SparkSession when its tests need them."""
SHARED_ON_ONE_WORKER = ("stack", "cluster")
LONG_GROUPS = (
    "tests/connectors/lakehouse/test_crash.py",
    "stack",
    "cluster",
    "tests/connectors/lakehouse/test_delta_golden.py",
    "tests/connectors/lakehouse/test_postgres_workload.py",
    "tests/test_docs_examples.py",
    "tests/connectors/test_sink_exactly_once.py",
)
"""The groups that take minutes (the durations scripts/test.sh prints), longest first."""
TEST_PER_GROUP = frozenset({"tests/connectors/lakehouse/test_crash.py"})
"""Modules whose tests take minutes each: each test is a group of its own, so both workers share them."""


def _kind(item: pytest.Item) -> str | None:
    """The kind a test's fixtures make it, unless it declares one itself."""
    if any(item.get_closest_marker(kind) is not None for kind in KINDS):
        return None
    fixtures = set(getattr(item, "fixturenames", ()))
    if any(fixtures & names for names in SERVICES.values()):
        return "process"
    return "spark" if "spark" in fixtures else "unit"


@pytest.fixture(autouse=True)
def _logging_as_it_was() -> Iterator[None]:
    """The ``cdcflow`` loggers as the test found them: a command run through ``cdcflow.cli.main`` gives the
    ``cdcflow`` logger a handler on the stderr of its moment (then closed) and stops it propagating, which
    would leave the ``caplog`` of a later test on the worker empty."""
    loggers = [logging.getLogger(name) for name in ("cdcflow", "py4j", *_cdcflow_logger_names())]
    saved = {lg: (lg.level, list(lg.handlers), lg.propagate, lg.disabled) for lg in loggers}
    yield
    for lg, (level, handlers, propagate, disabled) in saved.items():
        lg.level, lg.handlers, lg.propagate, lg.disabled = level, handlers, propagate, disabled
    for name in _cdcflow_logger_names():  # made during the test: as a logger nobody configured
        made = logging.getLogger(name)
        if made not in saved:
            made.level, made.handlers, made.propagate = logging.NOTSET, [], True
    logging.Logger.manager._clear_cache()


def _cdcflow_logger_names() -> list[str]:
    return [name for name in logging.Logger.manager.loggerDict if name.startswith("cdcflow.")]


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads the group marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        kind = _kind(item)
        if kind is not None:
            item.add_marker(kind)
        item.add_marker(pytest.mark.xdist_group(_group(item)))
    if getattr(config.option, "loadgroup", False):
        _heaviest_groups_first(items)


def _heaviest_groups_first(items: list[pytest.Item]) -> None:
    """Put the groups of :data:`LONG_GROUPS` first, then the others by their number of tests (pytest-xdist's
    own order, which scripts/test.sh turns off with --no-loadscope-reorder): the long groups start early
    and the short ones fill the end of the run on both workers."""
    count: defaultdict[str, int] = defaultdict(int)
    for item in items:
        count[_group(item)] += 1
    first = {group: at for at, group in reversed(list(enumerate(_group(item) for item in items)))}
    items.sort(key=lambda item: (_rank(g := _group(item)), -count[g], first[g]))


def _rank(group: str) -> int:
    return next((at for at, long in enumerate(LONG_GROUPS) if group.split("::")[0] == long), len(LONG_GROUPS))


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Under ``--dist loadgroup`` each test's node id ends with its group (pytest-xdist adds it); if not,
    the groups are silently ignored and every worker starts every service (a pytest that pytest-xdist
    cannot suffix: pyproject pins it)."""
    if getattr(session.config.option, "loadgroup", False) and any(
        "@" not in item.nodeid for item in session.items
    ):
        raise pytest.UsageError(
            f"pytest-xdist's --dist loadgroup did not group the tests (pytest {pytest.__version__}): "
            "install the pytest pyproject.toml's dev extra names"
        )
    if any(item.get_closest_marker("unit") is None for item in session.items):
        use_quick_jvms()


def _group(item: pytest.Item) -> str:
    """The tests of a module run on one worker (module fixtures are set up once), and so do all tests of a
    shared session service."""
    fixtures = set(getattr(item, "fixturenames", ()))
    shared = [group for group in SHARED_ON_ONE_WORKER if fixtures & SERVICES[group]]
    module = item.nodeid.split("::")[0]
    return shared[0] if shared else item.nodeid if module in TEST_PER_GROUP else module


_SECONDS: defaultdict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _SECONDS[str(Path(report.nodeid.split("::")[0]).parent)] += report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _SECONDS or hasattr(terminalreporter.config, "workerinput"):
        return
    terminalreporter.section("seconds per folder (setup + call + teardown, summed over workers)")
    for folder, seconds in sorted(_SECONDS.items(), key=lambda entry: -entry[1]):
        terminalreporter.write_line(f"{seconds:8.1f}  {folder}")
    terminalreporter.write_line(f"{sum(_SECONDS.values()):8.1f}  total")
