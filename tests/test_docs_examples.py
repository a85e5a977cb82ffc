"""Every command line and Python example of README.md and docs/*.md works with the package as it is.

- Every ``cdcflow ...``, ``python -m cdcflow ...`` and ``bash scripts/run.sh ...`` line of a code block
  (``\\`` continuations joined; also the arguments after ``cdcflow.__main__`` of a ``spark-submit``)
  parses with ``cdcflow.cli.parser()`` and uses no deprecated spelling.
- The commands that need nothing but this repository run from its root as ``python -m cdcflow ...``
  (the Spark ones marked ``integration``; ``--target`` / ``--checkpoint`` redirected into a temporary
  directory). The ones that need Kafka, a cluster, an object store or the reader's own file are skipped
  with their reason, and the counts of both are pinned, so no command goes unnoticed.
- Every ```python block's imports import; the blocks that need no Spark, Kafka or Delta run whole
  and print or return what the docs say.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import re
import shlex
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))

# What the docs hold today. A command added, removed or moved between "run" and "skipped" changes
# these on purpose: update them together with the docs.
EXPECTED_COMMANDS = 21
EXPECTED_RUN = 8
EXPECTED_SKIPPED = 13
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
# (b) the offline commands run; the others are skipped for a reason


@dataclass(frozen=True)
class Disposition:
    command: Command
    skip: str | None = None
    spark: bool = False


def _recorded_outputs() -> dict[str, Command]:
    return {output: c for c in COMMANDS if c.args[0] == "record" and (output := _flag(c.args, "--output"))}


def _disposition(command: Command, seen: dict[tuple[str, ...], Command]) -> Disposition:
    args = command.args
    if command.spark_submit:
        return Disposition(command, "spark-submit on a cluster (tests/connectors/cluster/test_deploy.py)")
    if "--help" in args or "-h" in args:
        return Disposition(command, "help text")
    servers = _flag(args, "--bootstrap-servers")
    if args[0] == "record" or servers:
        where = [value for value in args if value.startswith(("s3://", "s3a://", "abfss://", "gs://"))]
        also = f" and object storage ({', '.join(where)})" if where else ""
        return Disposition(command, f"needs a Kafka broker ({servers}){also}")
    config = _flag(args, "--config")
    if config and not (ROOT / config).exists():
        return Disposition(command, f"{config} is the reader's own settings file")
    path = _flag(args, "--path")
    if path and path != "-" and not (ROOT / path).exists():
        recorder = _recorded_outputs().get(path)
        if recorder is not None:
            return Disposition(command, f"needs Kafka: reads {path}, which `record` ({recorder.id}) writes")
        return Disposition(command, f"{path} stands for the reader's own file")
    key = _redirected(args, Path("TMP"))
    if key in seen:
        return Disposition(command, f"the same command as {seen[key].id}, run there")
    seen[key] = command
    return Disposition(command, spark=args[0] in {"stream", "ingest"})


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
    table = "\n".join(f"{d.command.id}: {d.skip or 'run'}: {d.command.text}" for d in DISPOSITIONS)
    counts = Counter("skip" if d.skip else "run" for d in DISPOSITIONS)
    assert (counts["run"], counts["skip"]) == (EXPECTED_RUN, EXPECTED_SKIPPED), table


def _params() -> list[Any]:
    params = []
    for d in DISPOSITIONS:
        marks = [pytest.mark.integration] if d.spark else []
        params.append(pytest.param(d, marks=marks, id=f"{d.command.id}-{d.command.args[0]}"))
    return params


def _claims(comment: str) -> list[str]:
    """What a command's comment says it prints: ``+I[1, Alice, Berlin]``, ``{"kind": "+I", ...``."""
    claims = re.findall(r"[+-][IUD]\[[^\]]*\]", comment)
    claims += [json_start.rstrip(", ") for json_start in re.findall(r"\{\"kind\".*?(?= \.\.\.|$)", comment)]
    return claims


@pytest.mark.parametrize("disposition", _params())
def test_command_runs(disposition: Disposition, tmp_path: Path) -> None:
    command = disposition.command
    if disposition.skip:
        pytest.skip(disposition.skip)
    args = _redirected(command.args, tmp_path)
    result = subprocess.run(  # noqa: S603 - our own module, the docs' arguments
        [sys.executable, "-m", "cdcflow", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        timeout=600 if disposition.spark else 120,
        check=False,
    )
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
        assert "cdcflow ingest: done:" in result.stderr and " 0 dead letter(s)" in result.stderr, shown
        assert re.search(r"^Delta table .* rows\)", result.stdout, re.M), shown  # the demo prints the table


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
