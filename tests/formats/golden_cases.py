"""Reading the recorded inputs (``testdata``) and the golden files written by ``scripts/flink_golden.py``
(Flink 2.3's output per recorded file)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cdcflow.formats import Message, Schema, parse_ddl

HERE = Path(__file__).parent
GOLDEN = HERE / "golden"
TESTDATA = HERE / "testdata"


@dataclass
class GoldenCase:
    case_id: str
    input: str
    format: str
    schema_ddl: str
    options: dict[str, str] = field(default_factory=dict)
    flink_error: str | None = None
    rows: list[str] = field(default_factory=list)

    @property
    def schema(self) -> Schema:
        return parse_ddl(self.schema_ddl)

    def messages(self) -> list[Message]:
        return messages(self.input)


def messages(relative: str) -> list[Message]:
    """The non-blank lines of a recorded file under ``testdata``, one message each, with file:line."""
    lines = (TESTDATA / relative).read_bytes().split(b"\n")
    return [Message(line, file=relative, line=n) for n, line in enumerate(lines, start=1) if line.strip()]


def load(path: Path) -> GoldenCase:
    headers: dict[str, list[str]] = {}
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            name, _, value = line[2:].partition(": ")
            headers.setdefault(name, []).append(value)
        elif line.strip():
            rows.append(line)
    options = {}
    for option in headers.get("option", []):
        key, _, value = option.partition("=")
        options[key] = value
    return GoldenCase(
        case_id=path.stem,
        input=headers["input"][0],
        format=headers["format"][0],
        schema_ddl=headers["schema"][0],
        options=options,
        flink_error=headers.get("flink-error", [None])[0],
        rows=rows,
    )


def flink_rows(case_id: str) -> list[str]:
    """Flink's changelog of a case, as ``+I[...]`` lines."""
    return load(GOLDEN / f"{case_id}.golden").rows


def all_cases() -> list[GoldenCase]:
    return [load(path) for path in sorted(GOLDEN.glob("*.golden"))]
