"""The README's engine example runs and does what it says."""

from __future__ import annotations

import re
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
