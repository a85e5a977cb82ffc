"""Every command line and Python example of README.md and docs/*.md works with the package as it is.

- Every ``cdcflow ...``, ``python -m cdcflow ...`` and ``bash scripts/run.sh ...`` line of a code block
  (``\\`` continuations joined; also the arguments after ``cdcflow.__main__`` of a ``spark-submit``)
  parses with ``cdcflow.cli.parser()`` and uses no deprecated spelling.
- The commands that need nothing but this repository run from its root (the Spark ones marked
  ``integration``; ``--target`` / ``--checkpoint`` redirected into a temporary directory): in the test's
  process through ``cdcflow.cli.main`` on the session's SparkSession (``tests/cli_runner.py``), but for
  one run per command (``inspect``, ``record``, ``stream``, ``ingest``) as ``python -m cdcflow ...``, a
  child process as its user starts it (``PROCESS_RUNS``).
- The commands that need Kafka run against the test session's broker (``kafka_cluster``, marked
  ``integration``), on topics filled with real Debezium envelopes beforehand, with the adaptations
  listed in ``KAFKA_ADAPTATIONS`` and nothing else; ``--trigger continuous`` stays continuous (new
  changes arrive while it runs, then it is stopped with Ctrl-C). Their outcomes are checked: the dump's
  records, the changelog's lines with their ``topic/partition@offset``, the Delta table's rows.
- The ones that need a cluster, an object store or the reader's own file are skipped with their
  reason, and the counts of run and skipped are pinned, so no command goes unnoticed.
- Every ```python block's imports import; the blocks that need no Spark, Kafka or Delta run whole
  and print or return what the docs say.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

# The session Kafka cluster fixture lives with the connector tests.
sys.path.insert(0, str(Path(__file__).resolve().parent / "connectors"))

from cli_runner import run_cli_in_process  # noqa: E402
from kafka_fixture import KafkaCluster, kafka_cluster, unique_topic  # noqa: E402, F401 - a session fixture
from spark_fixture import spark  # noqa: E402, F401 - a session fixture: the in-process runs use it

from cdcflow.formats import Message  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))

# What the docs hold today. A command added, removed or moved between "run" and "skipped" changes
# these on purpose: update them together with the docs.
EXPECTED_COMMANDS = 26
EXPECTED_RUN = 16  # 8 of them against the session's Kafka broker
EXPECTED_SKIPPED = 10
EXPECTED_PYTHON_BLOCKS = 20

SHELL_LANGUAGES = {"", "bash", "sh", "shell", "console"}
_FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```(?P<lang>[\w+-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S
)
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)(?P<tag>\w+)\1")
_ENV = r"(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*"
_RUN_SH = re.compile(rf"^{_ENV}(?:bash\s+)?(?:\./)?scripts/run\.sh(?:\s+(?P<rest>.*))?$")
_MODULE = re.compile(rf"^{_ENV}(?:\S*/)?python3?\s+-m\s+cdcflow(?:\s+(?P<rest>.*))?$")
_SCRIPT = re.compile(rf"^{_ENV}(?:\S*/)?cdcflow(?:\s+(?P<rest>.*))?$")
# A line that mentions cdcflow's command line in a form none of the patterns above takes.
_MENTION = re.compile(r"-m\s+cdcflow\b|scripts/run\.sh|(?:^|[|;&(]\s*)cdcflow\s|cdcflow\.__main__")


@dataclass(frozen=True)
class Place:
    doc: str
    line: int  # of a block: the line of the opening fence

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


@dataclass(frozen=True)
class Block(Place):
    lang: str
    body: str


@dataclass(frozen=True)
class Command(Place):
    text: str
    args: tuple[str, ...]
    spark_submit: bool = False


def _blocks() -> list[Block]:
    found = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for fence in _FENCE.finditer(text):
            indent = len(fence.group("indent"))
            body = "".join(line[indent:] for line in fence.group("body").splitlines(keepends=True))
            line = text.count("\n", 0, fence.start()) + 1
            found.append(Block(str(path.relative_to(ROOT)), line, fence.group("lang").lower(), body))
    return found


def _shell_lines(block: Block) -> Iterator[tuple[int, str, str | None]]:
    """(line number, logical line, heredoc body) of a shell block: continuations joined, heredocs apart."""
    lines = block.body.splitlines()
    index = 0
    while index < len(lines):
        number = block.line + 1 + index
        logical = lines[index]
        while logical.endswith("\\") and index + 1 < len(lines):
            index += 1
            logical = logical[:-1] + " " + lines[index].strip()
        index += 1
        heredoc = None
        tag = _HEREDOC.search(logical)
        if tag:
            body = []
            while index < len(lines) and lines[index].strip() != tag.group("tag"):
                body.append(lines[index])
                index += 1
            index += 1
            heredoc = "\n".join(body) + "\n"
        yield number, logical.strip(), heredoc


def _command(doc: str, number: int, line: str) -> Command | None:
    if "cdcflow.__main__" in line:  # spark-submit "$(python -c '...find_spec("cdcflow.__main__")...')" ARGS
        tokens = shlex.split(line, comments=True)
        start = next(i for i, token in enumerate(tokens) if "cdcflow.__main__" in token)
        return Command(doc, number, line, tuple(tokens[start + 1 :]), spark_submit=True)
    for pattern, default in ((_RUN_SH, ("ingest",)), (_MODULE, ()), (_SCRIPT, ())):
        found = pattern.match(line)
        if found:
            args = tuple(shlex.split(found.group("rest") or "", comments=True))
            return Command(doc, number, line, args or default)
    return None


def _extract() -> tuple[list[Command], list[Block], list[str]]:
    """The docs' commands, their Python blocks (heredocs of ``python -`` included) and any line that
    mentions the command line in a form not understood here."""
    commands: list[Command] = []
    python: list[Block] = []
    unknown: list[str] = []
    for block in _blocks():
        if block.lang == "python":
            python.append(block)
            continue
        if block.lang not in SHELL_LANGUAGES:
            continue
        for number, line, heredoc in _shell_lines(block):
            if heredoc is not None and re.match(r"^python3?\s+-\s", line):
                python.append(Block(block.doc, number, "python", heredoc))
                continue
            command = _command(block.doc, number, line)
            if command is not None:
                commands.append(command)
            elif _MENTION.search(line):
                unknown.append(f"{block.doc}:{number}: {line}")
    return commands, python, unknown


COMMANDS, PYTHON_BLOCKS, UNKNOWN_FORMS = _extract()


# ---------------------------------------------------------------------------------------------------
# (a) every command parses, in the current spelling


def _flag(args: tuple[str, ...], flag: str) -> str | None:
    """The value of ``flag`` (the last one given), for ``--flag VALUE`` and ``--flag=VALUE``."""
    value = None
    for index, arg in enumerate(args):
        if arg == flag and index + 1 < len(args):
            value = args[index + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1 :]
    return value


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]  # type: ignore[no-any-return]
    raise AssertionError("cdcflow's parser has no subcommands")


def test_the_docs_have_commands_and_every_form_is_understood() -> None:
    assert not UNKNOWN_FORMS, "a command line this test does not extract:\n" + "\n".join(UNKNOWN_FORMS)
    assert len(COMMANDS) == EXPECTED_COMMANDS, "\n".join(f"{c.id}: {c.text}" for c in COMMANDS)


@pytest.mark.parametrize("command", COMMANDS, ids=[c.id for c in COMMANDS])
def test_command_parses_in_the_current_spelling(command: Command, capsys: pytest.CaptureFixture[str]) -> None:
    from cdcflow.cli import parser

    cli = parser()
    try:
        namespace = cli.parse_args(list(command.args))
    except SystemExit:
        pytest.fail(f"{command.id} does not parse: {command.text}\n{capsys.readouterr().err}")
    err = capsys.readouterr().err
    assert "deprecated" not in err and "warning" not in err, (command.text, err)
    sub = _subparser(cli, command.args[0])
    old = [
        "/".join(action.option_strings) or action.dest
        for action in sub._actions
        # the new vocabulary has no positional arguments; old spellings are kept as hidden ones
        if (not action.option_strings or action.help == argparse.SUPPRESS)
        and action.dest != "help"
        and getattr(namespace, action.dest, action.default) not in (None, action.default, [])
    ]
    assert not old, f"{command.id} uses the deprecated {old}: {command.text}"
    for entry in getattr(namespace, "option", None) or ():
        key = entry.partition("=")[0].strip().lower()
        assert key not in {"columns", "metadata"}, f"{command.id}: show --schema / --metadata, not {key}="


# ---------------------------------------------------------------------------------------------------
# (b) the offline commands run, the Kafka ones against the session's broker; the others are skipped
#     for a reason


@dataclass(frozen=True)
class Disposition:
    command: Command
    skip: str | None = None
    spark: bool = False
    kafka: bool = False
    recorder: Command | None = None  # the `record` whose output this command reads: run first


_OBJECT_STORES = ("s3://", "s3a://", "abfss://", "gs://")


def _recorded_outputs() -> dict[str, Command]:
    return {output: c for c in COMMANDS if c.args[0] == "record" and (output := _flag(c.args, "--output"))}


def _disposition(command: Command, seen: dict[tuple[str, ...], Command]) -> Disposition:
    args = command.args
    uses_spark = args[0] in {"stream", "ingest"}
    if command.spark_submit:
        return Disposition(command, "spark-submit on a cluster (tests/connectors/cluster/test_deploy.py)")
    if "--help" in args or "-h" in args:
        return Disposition(command, "help text")
    servers = _flag(args, "--bootstrap-servers")
    where = [value for value in args if value.startswith(_OBJECT_STORES)]
    if where:
        also = f" and a Kafka broker ({servers})" if servers else ""
        return Disposition(command, f"needs object storage ({', '.join(where)}){also}")
    if args[0] == "record" or servers:
        return Disposition(command, spark=uses_spark, kafka=True)
    config = _flag(args, "--config")
    if config and not (ROOT / config).exists():
        return Disposition(command, f"{config} is the reader's own settings file")
    path = _flag(args, "--path")
    if path and path != "-" and not (ROOT / path).exists():
        recorder = _recorded_outputs().get(path)
        if recorder is not None:
            return Disposition(command, spark=uses_spark, kafka=True, recorder=recorder)
        return Disposition(command, f"{path} stands for the reader's own file")
    key = _redirected(args, Path("TMP"))
    if key in seen:
        return Disposition(command, f"the same command as {seen[key].id}, run there")
    seen[key] = command
    return Disposition(command, spark=uses_spark)


def _redirected(args: tuple[str, ...], tmp: Path) -> tuple[str, ...]:
    """``args`` writing their Delta table and checkpoint under ``tmp`` (ingest always writes both)."""
    out = list(args)
    wanted = {"--target": tmp / "table", "--checkpoint": tmp / "checkpoint"}
    if args[0] != "ingest":
        wanted = {"--checkpoint": tmp / "checkpoint"} if "--checkpoint" in args else {}
    for flag, value in wanted.items():
        out = [f"{flag}={value}" if arg.startswith(flag + "=") else arg for arg in out]
        if flag in out:
            out[out.index(flag) + 1] = str(value)
        elif not any(arg.startswith(flag + "=") for arg in out):
            out += [flag, str(value)]
    return tuple(out)


def _dispositions() -> list[Disposition]:
    seen: dict[tuple[str, ...], Command] = {}
    return [_disposition(command, seen) for command in COMMANDS]


DISPOSITIONS = _dispositions()


def test_every_command_runs_or_is_skipped_for_a_reason() -> None:
    def what(d: Disposition) -> str:
        return d.skip or ("run against Kafka" if d.kafka else "run")

    table = "\n".join(f"{d.command.id}: {what(d)}: {d.command.text}" for d in DISPOSITIONS)
    counts = Counter("skip" if d.skip else "run" for d in DISPOSITIONS)
    assert (counts["run"], counts["skip"]) == (EXPECTED_RUN, EXPECTED_SKIPPED), table


def _continuous(command: Command) -> bool:
    return _flag(command.args, "--trigger") == "continuous"


def _process_runs() -> frozenset[str]:
    """The commands that run as a ``python -m cdcflow`` child process (by id); the others run in the
    test's process (``tests/cli_runner.py``). A ``--trigger continuous`` one is stopped with Ctrl-C and
    must exit 130: always a process. Each command of the command line runs as a process at least once
    (a smoke test of the entry point, its exit code and output): the first of the docs when none of its
    runs is a continuous one."""
    runs = [d for d in DISPOSITIONS if not d.skip]
    chosen = {d.command.id for d in runs if _continuous(d.command)}
    for name in dict.fromkeys(d.command.args[0] for d in runs):
        mine = [d.command for d in runs if d.command.args[0] == name]
        if not any(c.id in chosen for c in mine):
            chosen.add(mine[0].id)
    return frozenset(chosen)


PROCESS_RUNS = _process_runs()


def test_every_command_runs_as_a_process_at_least_once() -> None:
    """The docs' commands run in-process but for a ``python -m cdcflow`` smoke run of each command."""
    ran = {d.command.args[0] for d in DISPOSITIONS if d.command.id in PROCESS_RUNS}
    assert ran == {"inspect", "record", "stream", "ingest"}, sorted(PROCESS_RUNS)
    assert all(d.command.id in PROCESS_RUNS for d in DISPOSITIONS if _continuous(d.command) and not d.skip)


def _params() -> list[Any]:
    params = []
    for d in DISPOSITIONS:
        marks = [pytest.mark.integration] if d.spark or d.kafka else []
        if d.command.id in PROCESS_RUNS:
            marks.append(pytest.mark.process)
        params.append(pytest.param(d, marks=marks, id=f"{d.command.id}-{d.command.args[0]}"))
    return params


def _claims(comment: str) -> list[str]:
    """What a command's comment says it prints: ``+I[1, Alice, Berlin]``, ``{"kind": "+I", ...``."""
    claims = re.findall(r"[+-][IUD]\[[^\]]*\]", comment)
    claims += [json_start.rstrip(", ") for json_start in re.findall(r"\{\"kind\".*?(?= \.\.\.|$)", comment)]
    return claims


Run = Callable[[tuple[str, ...]], subprocess.CompletedProcess[str]]
"""How a test runs a docs command: as a child process, or in-process (:func:`_runner`)."""


def _runner(disposition: Disposition, session: Any) -> Run:
    """Run the command of ``disposition`` as a process (``PROCESS_RUNS``) or in the test's process, from
    the repository's root; a command it reads the output of (``recorder``) runs in-process."""
    process = disposition.command.id in PROCESS_RUNS

    def run(args: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
        if process and args[0] == disposition.command.args[0]:
            return _run_cli(args, disposition.spark)
        uses_spark = args[0] in {"stream", "ingest"}
        return run_cli_in_process(
            *args, spark=session if uses_spark else None, cwd=ROOT, timeout=600 if uses_spark else 120
        )

    return run


def _run_cli(args: tuple[str, ...], uses_spark: bool) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603 - our own module, the docs' arguments
        [sys.executable, "-m", "cdcflow", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        timeout=600 if uses_spark else 120,
        check=False,
    )


def _summary_without_dead_letters(stderr: str, status: str) -> bool:
    """Whether the run's summary (``cdcflow ingest: STATUS...``, non-zero counts only) accounts for the
    messages read and reports no dead letter."""
    summary = [line for line in stderr.splitlines() if line.startswith(f"cdcflow ingest: {status}")]
    return bool(summary) and "messages read" in summary[-1] and "dead letter" not in summary[-1]


@pytest.mark.parametrize("disposition", _params())
def test_command_runs(
    disposition: Disposition,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    spark: Any,  # noqa: F811 - the session fixture
) -> None:
    command = disposition.command
    if disposition.skip:
        pytest.skip(disposition.skip)
    run_cli = _runner(disposition, spark)
    if disposition.kafka:
        _run_with_kafka(disposition, request.getfixturevalue("kafka_cluster"), tmp_path, run_cli)
        return
    args = _redirected(command.args, tmp_path)
    result = run_cli(args)
    shown = f"{command.id}: {command.text}\nout:\n{result.stdout[-3000:]}\nerr:\n{result.stderr[-3000:]}"
    assert result.returncode == 0, shown
    assert result.stdout.strip(), shown
    assert "deprecated" not in result.stderr, shown
    comment = command.text.partition(" #")[2]
    for claim in _claims(comment):
        assert claim in result.stdout, f"the comment's {claim!r} is not printed\n{shown}"
    if args[0] == "inspect":
        assert re.search(r"^(?:[+-][IUD]\[|\{\"kind\")", result.stdout, re.M), shown
    if args[0] == "stream":
        # each change with where it came from: topic/partition@offset, or file:line for a plain file
        assert re.search(r"^(?:\S+/\d+@\d+|\S+:\d+) [+-][IUD]\[", result.stdout, re.M), shown
        assert not re.search(r"^\S*None\S* ", result.stdout, re.M), f"a change without its origin\n{shown}"
    if args[0] == "ingest":
        assert (tmp_path / "table" / "_delta_log").is_dir(), shown
        assert _summary_without_dead_letters(result.stderr, "done:"), shown
        assert re.search(r"^Delta table .* rows\)", result.stdout, re.M), shown  # the demo prints the table


# ---------------------------------------------------------------------------------------------------
# (b, Kafka) the Kafka commands against the session's broker

# What a Kafka command of the docs is changed in, and nothing else (each run lists the ones it made in
# any failure's message):
KAFKA_ADAPTATIONS = (
    "--bootstrap-servers (localhost:9092, HOST:PORT, ...) is the session broker's address",
    "each topic is a new one, unique to the test (--topic and the topic names of the subscribe, "
    "startingOffsets, endingOffsets and assign options alike), created with the partitions the "
    "command names (else one) and filled with real Debezium envelopes before the command runs",
    "--output, --target and --checkpoint write under the test's temporary directory",
    "a --path that a `record` of the docs writes (orders.dump.jsonl) is that record's output, "
    "recorded first in the same test",
    "--option kafka.security.protocol=SSL is left out: the session broker listens in plaintext",
)

# Real Debezium envelopes for the docs' topics, chosen by how the command reads them:
# - with schemas (`schema-include=true`), and what `record` records: the bundled recording of Debezium
#   3.6 on PostgreSQL 15 (25 column types, keys, headers, updates, deletes and their tombstones);
# - without schemas, under a --schema of Debezium's tutorial table inventory.products: Flink's test
#   data of Debezium 1.1 on MySQL for that table (topic dbserver1.inventory.products).
BUNDLED_DUMP = ROOT / "api/examples/postgres-debezium.dump.jsonl"
PRODUCTS = ROOT / "tests/formats/testdata/flink/debezium-data-schema-exclude.txt"
_KINDS = {"c": ["+I"], "r": ["+I"], "u": ["-U", "+U"], "d": ["-D"]}
_LINE = re.compile(r"^(?P<topic>\S+)/(?P<partition>\d+)@(?P<offset>\d+) (?P<shown>.*)$")
_CONTINUOUS_WAIT_S = 300


@dataclass
class KafkaRun:
    """A docs command made ready to run against the session's broker."""

    args: tuple[str, ...]
    topics: dict[str, str] = field(default_factory=dict)  # the docs' name -> the test's
    starts: dict[str, dict[int, int]] = field(default_factory=dict)  # test topic -> partition -> start
    adaptations: list[str] = field(default_factory=list)
    planned: list[Message] = field(default_factory=list)  # what the topics hold, with coordinates
    source: str = ""  # where the envelopes come from

    def shown(self, command: Command, result: Any = None) -> str:
        text = f"{command.id}: {command.text}\nran: {shlex.join(self.args)}\nadapted: " + "; ".join(
            self.adaptations
        )
        if result is not None:
            text += (
                f"\nexit {result.returncode}\nout:\n{result.stdout[-3000:]}\nerr:\n{result.stderr[-3000:]}"
            )
        return text


def _pairs(args: tuple[str, ...]) -> list[str]:
    """``args`` with every ``--flag=value`` as two tokens."""
    out: list[str] = []
    for arg in args:
        if arg.startswith("--") and "=" in arg:
            out += arg.split("=", 1)
        else:
            out.append(arg)
    return out


def _options(args: tuple[str, ...]) -> dict[str, str]:
    tokens = _pairs(args)
    entries = [value for flag, value in zip(tokens, tokens[1:], strict=False) if flag == "--option"]
    return {key.strip().lower(): value for key, _, value in (entry.partition("=") for entry in entries)}


def _bundled() -> list[Message]:
    from cdcflow.connectors.replay.dumps import read_messages

    return [
        Message(m.value, m.key, timestamp_ms=m.timestamp_ms, headers=m.headers)
        for m in read_messages(str(BUNDLED_DUMP))
    ]


def _products() -> list[Message]:
    return [Message(line) for line in PRODUCTS.read_bytes().splitlines() if line.strip()]


def _payload(message: Message) -> dict[str, Any] | None:
    """The Debezium envelope of ``message`` (its ``payload`` when it has a schema); None for a tombstone."""
    if message.value is None:
        return None
    envelope: dict[str, Any] = json.loads(message.value)
    return envelope["payload"] if set(envelope) == {"schema", "payload"} else envelope


def _columns(schema: str) -> list[str]:
    return [column.split()[0].strip("`") for column in schema.split(",")]


def _envelopes(args: tuple[str, ...]) -> tuple[str, list[Message]]:
    options = _options(args)
    include = options.get("schema-include", options.get("debezium-json.schema-include", "false"))
    if args[0] == "record" or include.strip().lower() == "true":
        return str(BUNDLED_DUMP.relative_to(ROOT)), _bundled()
    schema = _flag(args, "--schema")
    assert schema is not None, (
        f"no envelopes chosen for a command reading without schemas or --schema: {args}"
    )
    messages = _products()
    after = _payload(messages[0])
    assert after is not None and set(_columns(schema)) <= set(after["after"]), (schema, after)
    return str(PRODUCTS.relative_to(ROOT)), messages


def _kafka_run(args: tuple[str, ...], tmp: Path, bootstrap: str) -> KafkaRun:
    """``args`` adapted as KAFKA_ADAPTATIONS says, with the topics' planned contents."""
    run = KafkaRun(args)
    source, envelopes = _envelopes(args)

    def rename(topic: str) -> str:
        if topic not in run.topics:
            run.topics[topic] = unique_topic(re.sub(r"[^\w.-]", "-", topic))
            run.starts[run.topics[topic]] = {0: -2}
        return run.topics[topic]

    def option(entry: str) -> str | None:
        key, _, value = entry.partition("=")
        lowered = key.strip().lower()
        if lowered == "kafka.security.protocol" and value.strip().upper() != "PLAINTEXT":
            run.adaptations.append(f"--option {entry} left out (the session broker listens in plaintext)")
            return None
        if lowered == "subscribe":
            return f"{key}={','.join(rename(topic.strip()) for topic in value.split(','))}"
        if lowered in {"startingoffsets", "endingoffsets", "assign"} and value.strip().startswith("{"):
            spec: dict[str, Any] = json.loads(value)
            renamed = {rename(topic): partitions for topic, partitions in spec.items()}
            for topic, partitions in renamed.items():
                if lowered == "startingoffsets":
                    run.starts[topic] = {int(p): int(offset) for p, offset in partitions.items()}
                elif lowered == "assign":
                    run.starts[topic] = {int(p): -2 for p in partitions}
            return f"{key}={json.dumps(renamed, separators=(',', ':'))}"
        return entry

    tokens = _pairs(args)
    out = [tokens[0]]
    index = 1
    while index < len(tokens):
        flag, value = tokens[index], tokens[index + 1] if index + 1 < len(tokens) else ""
        if flag == "--bootstrap-servers":
            out += [flag, bootstrap]
            run.adaptations.append(f"--bootstrap-servers {value} -> {bootstrap}")
        elif flag == "--topic":
            out += [flag, rename(value)]
        elif flag == "--option":
            kept = option(value)
            out += [flag, kept] if kept is not None else []
        elif flag == "--output":
            out += [flag, str(tmp / Path(value).name)]
            run.adaptations.append(f"--output {value} -> {out[-1]}")
        else:
            out.append(flag)
            index += 1
            continue
        index += 2
    run.args = _redirected(tuple(out), tmp)
    if run.args[0] == "ingest":
        run.adaptations.append(f"--target and --checkpoint -> {tmp / 'table'}, {tmp / 'checkpoint'}")
    # Each partition holds the envelopes (as often as it takes to reach the offset the command starts at).
    run.source = source
    for doc_topic, topic in run.topics.items():
        starts = run.starts[topic]
        for partition in range(max(starts) + 1):
            copies = 1 + max(starts.get(partition, -2), 0) // len(envelopes)
            for offset, m in enumerate(m for _ in range(copies) for m in envelopes):
                run.planned.append(
                    Message(m.value, m.key, topic, partition, offset, m.timestamp_ms, m.headers)
                )
        count = sum(1 for m in run.planned if m.topic == topic)
        run.adaptations.append(
            f"topic {doc_topic} -> {topic}: {max(starts) + 1} partition(s), {count} envelopes of {source}"
        )
    return run


_ADAPTED_FLAGS = {"--bootstrap-servers", "--topic", "--output", "--target", "--checkpoint"}


def _as_written(args: tuple[str, ...], topics: dict[str, str]) -> list[str]:
    """``args`` without the values KAFKA_ADAPTATIONS changes, the test's topic names read as the docs'."""
    tokens = _pairs(args)
    out: list[str] = []
    for index, token in enumerate(tokens):
        if index and tokens[index - 1] in _ADAPTED_FLAGS:
            continue
        if index and tokens[index - 1] == "--option":
            if re.match(r"\s*kafka\.security\.protocol\s*=", token, re.I):
                out.pop()  # the one option left out
                continue
            for doc_topic, topic in topics.items():
                token = token.replace(topic, doc_topic)
        out.append(token)
    return out


def test_kafka_commands_run_as_written_but_for_the_listed_adaptations(tmp_path: Path) -> None:
    kafka = [d for d in DISPOSITIONS if d.kafka and d.recorder is None]
    assert kafka, "no Kafka command in the docs"
    for d in kafka:
        run = _kafka_run(d.command.args, tmp_path, "127.0.0.1:1")
        assert _as_written(run.args, run.topics) == _as_written(d.command.args, {}), run.shown(d.command)
        assert (
            "--bootstrap-servers" not in d.command.args
            or _flag(run.args, "--bootstrap-servers") == "127.0.0.1:1"
        )
        for flag in ("--output", "--target", "--checkpoint"):
            assert (value := _flag(run.args, flag)) is None or Path(value).is_relative_to(tmp_path), run.args
        assert set(run.topics) and all(topic not in run.topics.values() for topic in run.topics), run.topics


def _create_and_produce(cluster: KafkaCluster, run: KafkaRun, messages: list[Message]) -> None:
    for topic in run.topics.values():
        cluster.create_topic(topic, max(run.starts[topic]) + 1)
    _produce(cluster, messages)


def _produce(cluster: KafkaCluster, messages: list[Message]) -> None:
    from cdcflow.connectors.kafka.producer import produce_messages

    for topic in dict.fromkeys(m.topic for m in messages):
        mine = [m for m in messages if m.topic == topic]
        assert produce_messages(cluster.bootstrap_servers, mine, topic) == len(mine)


def _run_with_kafka(disposition: Disposition, cluster: KafkaCluster, tmp: Path, run_cli: Run) -> None:
    command = disposition.command
    if disposition.recorder is not None:  # record first, then read what it wrote
        recorded = _kafka_run(disposition.recorder.args, tmp, cluster.bootstrap_servers)
        output = _record(disposition.recorder, recorded, cluster, run_cli)
        args = _pairs(command.args)
        args[args.index("--path") + 1] = str(output)
        run = KafkaRun(_redirected(tuple(args), tmp), adaptations=recorded.adaptations)
        run.adaptations.append(
            f"--path {_flag(command.args, '--path')} -> {output}, which {disposition.recorder.id} wrote"
        )
        from cdcflow.connectors.replay.dumps import read_messages

        run.planned = list(read_messages(str(output)))
        run.source = f"{output} ({recorded.source})"
        _check_changelog_or_table(command, run, run_cli(run.args), tmp)
        return
    run = _kafka_run(command.args, tmp, cluster.bootstrap_servers)
    if run.args[0] == "record":
        _record(command, run, cluster, run_cli)
    elif _flag(run.args, "--trigger") == "continuous":
        _run_continuous(command, run, cluster, tmp)
    else:
        _create_and_produce(cluster, run, run.planned)
        _check_changelog_or_table(command, run, run_cli(run.args), tmp)


def _record(command: Command, run: KafkaRun, cluster: KafkaCluster, run_cli: Run) -> Path:
    """Run a docs `record` and check its dump holds what the topics hold from the start offsets on."""
    from cdcflow.connectors.replay.dumps import read_messages

    _create_and_produce(cluster, run, run.planned)
    result = run_cli(run.args)
    shown = run.shown(command, result)
    assert result.returncode == 0, shown
    assert "deprecated" not in result.stderr and "Traceback" not in result.stderr, shown
    output = Path(_flag(run.args, "--output") or "")
    wanted = [
        m
        for m in run.planned
        if run.starts[m.topic or ""].get(m.partition or 0, -2) != -1
        and (m.offset or 0) >= run.starts[m.topic or ""].get(m.partition or 0, -2)
    ]
    [topic] = run.topics.values()
    partitions = max(run.starts[topic]) + 1
    summary = f"cdcflow: recorded {len(wanted)} records from {partitions} partitions of {topic} to {output}"
    assert summary in result.stderr.splitlines(), f"expected {summary!r}\n{shown}"

    def seen(m: Message) -> tuple[Any, ...]:
        return (m.topic, m.partition, m.offset, m.key, m.value, m.headers)

    got = list(read_messages(str(output)))
    wanted.sort(key=lambda m: (m.topic, m.partition, m.offset))
    assert [seen(m) for m in got] == [seen(m) for m in wanted], shown
    # the produced timestamps; where none was given (the bundled tombstones), the producer's CreateTime
    stamps = [(w.timestamp_ms, g.timestamp_ms) for g, w in zip(got, wanted, strict=True)]
    assert all(g == w if w is not None else g is not None and g > 0 for w, g in stamps), (stamps, shown)
    return output


def _expected_kinds(messages: list[Message]) -> Counter[str]:
    kinds: Counter[str] = Counter()
    for m in messages:
        envelope = _payload(m)
        if envelope is not None:
            kinds.update(_KINDS[envelope["op"]])
    return kinds


def _strings(messages: list[Message]) -> set[str]:
    """The string values of the rows of ``messages`` that hold a newline."""
    found = set()
    for m in messages:
        envelope = _payload(m)
        for row in (envelope or {}).get("before"), (envelope or {}).get("after"):
            found |= {v for v in (row or {}).values() if isinstance(v, str) and "\n" in v}
    return found


def _final_rows(messages: list[Message], key: list[str]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The rows of the source table after ``messages``, by key (what ingest's Delta table must hold)."""
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    for m in messages:
        envelope = _payload(m)
        if envelope is None:
            continue
        if envelope["op"] == "d":
            rows.pop(tuple(envelope["before"][k] for k in key), None)
        else:
            rows[tuple(envelope["after"][k] for k in key)] = envelope["after"]
    return rows


def _table_rows(target: Path, key: list[str], columns: list[str]) -> dict[tuple[Any, ...], dict[str, Any]]:
    from deltalake import DeltaTable

    rows = DeltaTable(str(target)).to_pyarrow_table().to_pylist()
    return {tuple(row[k] for k in key): {c: row[c] for c in columns} for row in rows}


def _wanted_rows(run: KafkaRun, messages: list[Message]) -> tuple[list[str], list[str], dict[Any, Any]]:
    """The key, the compared columns (the --schema's, else the key) and the rows the table must hold."""
    key = [k.strip() for k in (_flag(run.args, "--key") or "").split(",") if k.strip()]
    schema = _flag(run.args, "--schema")
    columns = _columns(schema) if schema else key
    rows = {k: {c: row[c] for c in columns} for k, row in _final_rows(messages, key).items()}
    return key, columns, rows


def _check_changelog_or_table(command: Command, run: KafkaRun, result: Any, tmp: Path) -> None:
    shown = run.shown(command, result)
    assert result.returncode == 0, shown
    assert "deprecated" not in result.stderr and "Traceback" not in result.stderr, shown
    if run.args[0] == "stream":
        lines = result.stdout.split("\n")[:-1]
        found = [_LINE.match(line) for line in lines]
        # A string value is printed as it is (like Flink's Row.toString), so a row with a newline in a
        # string goes on over the next line: the only lines without their topic/partition@offset.
        pieces = tuple(piece for value in _strings(run.planned) for piece in value.split("\n")[1:])
        strays = [line for line, f in zip(lines, found, strict=True) if f is None]
        assert lines and all(line.startswith(pieces) for line in strays), (strays, shown)
        changes = [f for f in found if f is not None and re.match(r"[+-][IUD]\[", f["shown"])]
        where = {(f["topic"], int(f["partition"]), int(f["offset"])) for f in changes}
        assert where == {(m.topic, m.partition, m.offset) for m in run.planned if m.value is not None}, shown
        assert Counter(f["shown"][:2] for f in changes) == _expected_kinds(run.planned), shown
    elif run.args[0] == "ingest":
        assert _summary_without_dead_letters(result.stderr, "done:"), shown
        key, columns, wanted = _wanted_rows(run, run.planned)
        assert _table_rows(tmp / "table", key, columns) == wanted, shown
        if "--show" in run.args:
            printed = rf"^Delta table {re.escape(str(tmp / 'table'))} \(version \d+, {len(wanted)} rows\)"
            assert re.search(printed, result.stdout, re.M), shown
    else:
        raise AssertionError(f"no check for {run.args[0]}: {shown}")


def _run_continuous(command: Command, run: KafkaRun, cluster: KafkaCluster, tmp: Path) -> None:
    """Start the ingest; the first half of the envelopes before, the rest once it has applied them; wait
    for the table to hold all; stop it with Ctrl-C, as its user would; it stops cleanly with a summary."""
    first, rest = run.planned[: len(run.planned) // 2], run.planned[len(run.planned) // 2 :]
    _create_and_produce(cluster, run, first)
    target = tmp / "table"
    out_path, err_path = tmp / "ingest.stdout", tmp / "ingest.stderr"
    with out_path.open("w") as out, err_path.open("w") as err:
        process = subprocess.Popen(  # noqa: S603 - our own module, the docs' arguments
            [sys.executable, "-m", "cdcflow", *run.args],
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            cwd=ROOT,
            text=True,
            start_new_session=True,
        )
    deadline = time.monotonic() + _CONTINUOUS_WAIT_S

    def shown() -> str:
        out, err = out_path.read_text()[-3000:], err_path.read_text()[-3000:]
        return f"{run.shown(command)}\nexit {process.poll()}\nout:\n{out}\nerr:\n{err}"

    def wait_for(messages: list[Message]) -> None:
        key, columns, wanted = _wanted_rows(run, messages)
        got: Any = None
        while time.monotonic() < deadline:
            assert process.poll() is None, f"ingest --trigger continuous ended by itself\n{shown()}"
            if (target / "_delta_log").is_dir():
                with contextlib.suppress(Exception):  # a table being created, a commit being written
                    got = _table_rows(target, key, columns)
                if got == wanted:
                    return
            time.sleep(1)
        raise AssertionError(f"the table never held {wanted}, last {got}\n{shown()}")

    try:
        wait_for(first)
        _produce(cluster, rest)
        wait_for(run.planned)
        os.killpg(process.pid, signal.SIGINT)  # as a terminal's Ctrl-C does: the whole process group
        code = process.wait(timeout=180)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    stderr = err_path.read_text()
    assert code == 130, shown()  # README: exit codes
    assert "Traceback" not in stderr and "deprecated" not in stderr, shown()
    assert _summary_without_dead_letters(stderr, "interrupted (Ctrl-C): committed "), shown()


# ---------------------------------------------------------------------------------------------------
# (c) every Python block's imports import; the offline ones run whole


def _imports(source: str) -> str:
    """The block's ``import`` / ``from ... import`` statements, at any indentation, as one program."""
    statements = []
    lines = source.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index].strip()
        index += 1
        if not re.match(r"(?:import\s+\w|from\s+[\w.]+\s+import\s)", line):
            continue
        line = line.split("#", 1)[0].rstrip()
        while (line.count("(") > line.count(")") or line.endswith("\\")) and index < len(lines):
            line = line.rstrip("\\") + " " + lines[index].split("#", 1)[0].strip()
            index += 1
        statements.append(line)
    return "\n".join(statements)


def test_the_docs_have_python_blocks() -> None:
    assert len(PYTHON_BLOCKS) == EXPECTED_PYTHON_BLOCKS, [b.id for b in PYTHON_BLOCKS]


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=[b.id for b in PYTHON_BLOCKS])
def test_python_block_imports(block: Block) -> None:
    program = _imports(block.body)
    exec(compile(program, block.id, "exec"), {})  # noqa: S102 - the docs' own import lines


def _run(block: Block, namespace: dict[str, Any]) -> Any:
    """Execute ``block`` as a REPL would: the value of its last expression statement is returned."""
    tree = ast.parse(textwrap.dedent(block.body), block.id)
    last = tree.body[-1] if tree.body else None
    if not isinstance(last, ast.Expr):
        exec(compile(tree, block.id, "exec"), namespace)  # noqa: S102 - the docs' own example
        return None
    tree.body.pop()
    exec(compile(tree, block.id, "exec"), namespace)  # noqa: S102 - the docs' own example
    return eval(compile(ast.Expression(last.value), block.id, "eval"), namespace)  # noqa: S307


def _engine_example(block: Block) -> None:
    namespace: dict[str, Any] = {}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        _run(block, namespace)
    # each print's output is the comment under or beside it
    assert printed.getvalue().splitlines() == [
        "+I[1, Alice, 1] -U[1, Alice, 2] +U[1, Al, 2] -D[1, Al, 3]",
        "+I[1, Alice] -U[1, Alice] +U[1, Al]",
    ]
    assert f"print(*changes)   # {printed.getvalue().splitlines()[0]}" in block.body
    assert f"# {printed.getvalue().splitlines()[1]}" in block.body
    assert namespace["back"] == namespace["envelopes"]  # "the result equals `envelopes`"


def _formats_example(block: Block) -> None:
    from cdcflow.core import Change, RowKind

    envelope = (ROOT / "tests/formats/testdata/flink/debezium-postgres-data-schema-include.txt").read_bytes()
    namespace: dict[str, Any] = {
        "value": envelope.splitlines()[0],
        "key": None,
        "changes": [
            Change(RowKind.UPDATE_BEFORE, {"id": 1, "name": "old"}),
            Change(RowKind.UPDATE_AFTER, {"id": 1, "name": "new"}),
        ],
    }
    _run(block, namespace)
    out = namespace["out"]
    assert [change.kind for change in out.changes] == [RowKind.INSERT]
    assert out.changes[0].row["source_table"] == "products"  # metadata=["source.table"]
    assert out.dead_letters == [] and out.events == []
    [record] = namespace["records"]  # "an update is encoded as one event"
    assert record.key == b'{"id":1}'
    assert json.loads(record.value)["op"] == "u"


def _versioned_example(block: Block) -> None:
    from cdcflow.core import Change, RowKind

    kinds = {kind.value: kind for kind in RowKind}
    doc = (ROOT / "docs/versioned.md").read_text(encoding="utf-8")
    changelog = re.search(r"```\n(\+I 00:01.*?)```", doc, re.S)
    assert changelog is not None, "docs/versioned.md lost the products changelog"

    def at(hh_mm: str) -> datetime:
        hour, minute = hh_mm.split(":")
        return datetime(2024, 1, 1, int(hour), int(minute))

    changes = []
    for line in changelog.group(1).splitlines():
        kind, time, product_id, name, price = line.split()
        row = {"update_time": at(time), "product_id": product_id, "product_name": name, "price": float(price)}
        changes.append(Change(kinds[kind], row))
    namespace: dict[str, Any] = {"changes": changes, "t": at("13:00")}
    valid = _run(block, namespace)
    prices = {row["product_id"]: row["price"] for row in valid}
    assert prices == {"p_001": 12.99, "p_002": 19.99}  # "as of 13:00 12.99 and 19.99"
    history = namespace["history"]
    assert sorted((v.key[0], v.row["price"]) for v in history) == [
        ("p_001", 11.11),
        ("p_001", 12.99),
        ("p_002", 19.99),
        ("p_002", 23.11),
    ]
    as_of = namespace["as_of"]
    assert sorted(row["price"] for row in as_of(history, at("10:00"))) == [11.11, 23.11]
    assert [row["product_id"] for row in as_of(history, at("18:00"))] == ["p_002"]


# The blocks that need neither Spark nor Kafka nor Delta, found by their first line.
OFFLINE_BLOCKS: dict[str, Callable[[Block], None]] = {
    "from datetime import timedelta\nfrom cdcflow import from_changelog, to_changelog": _engine_example,
    "from cdcflow.formats import Message, parse_ddl, resolve_format": _formats_example,
    "from cdcflow.core import versions_of, as_of, deduplicate_latest, Version": _versioned_example,
}


@pytest.mark.parametrize("start", OFFLINE_BLOCKS)
def test_offline_python_block_runs(start: str) -> None:
    matches = [block for block in PYTHON_BLOCKS if block.body.startswith(start)]
    assert len(matches) == 1, f"expected one python block starting {start!r}, found {len(matches)}"
    OFFLINE_BLOCKS[start](matches[0])


# ---------------------------------------------------------------------------------------------------
# the dotted names the prose names


_NOT_PYTHON = {"cdcflow.options", "cdcflow.error.reason", "cdcflow.error.field", "cdcflow.error.format"}
_NOT_PYTHON |= {"cdcflow.error.origin"}  # Kafka header names and a column metadata key


def _dotted_names() -> list[tuple[str, str]]:
    names = set()
    for path in DOCS:
        if path.name == "architecture.md":
            continue  # it names the layout's patterns (`cdcflow.core.x`), not objects
        for name in re.findall(r"`(cdcflow(?:\.[A-Za-z_]\w*)+)", path.read_text(encoding="utf-8")):
            names.add((str(path.relative_to(ROOT)), name))
    return sorted(names)


@pytest.mark.parametrize(("doc", "name"), _dotted_names())
def test_dotted_name_in_the_prose_exists(doc: str, name: str) -> None:
    import importlib

    if name in _NOT_PYTHON:
        return
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        try:
            target: Any = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[split:]:
            assert hasattr(target, attribute), f"{doc} names {name}, which does not exist"
            target = getattr(target, attribute)
        return
    raise AssertionError(f"{doc} names {name}, which does not exist")
