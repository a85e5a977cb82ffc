"""The README's engine example runs and does what it says."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_engine_example_round_trips() -> None:
    block = re.search(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert block is not None, "README lost its python example"
    namespace: dict[str, Any] = {}
    exec(compile(block.group(1), str(README), "exec"), namespace)  # noqa: S102 - our own README
    assert [str(c) for c in namespace["changes"]] == [
        "+I[1, Alice, 1]",
        "-U[1, Alice, 2]",
        "+U[1, Al, 2]",
        "-D[1, Al, 3]",
    ]
    assert namespace["back"] == namespace["envelopes"]


def test_readme_inspector_commands_run() -> None:
    """Every ``python -m cdcflow inspect`` command the README shows runs from the repository root."""
    text = README.read_text(encoding="utf-8").replace("\\\n", " ")
    commands = re.findall(r"^python -m cdcflow (inspect [^#\n]*)", text, re.M)
    assert len(commands) >= 5
    for command in commands:
        args = shlex.split(command)
        if any(arg.endswith(".jsonl") and not (README.parent / arg).exists() for arg in args):
            continue  # the placeholder file name of the usage lines
        result = subprocess.run(  # noqa: S603 - our own module, README arguments
            [sys.executable, "-m", "cdcflow", *args],
            capture_output=True,
            text=True,
            cwd=README.parent,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, (command, result.stderr)
        assert result.stdout.strip(), command
