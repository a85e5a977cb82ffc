"""One comparison's measurements as a bench hands them to bench/all.py (``--json FILE``).

A comparison is a unit of work (``amount`` changes or rows, ``bytes`` of input) done by each
contender in interleaved rounds; ``seconds`` holds every round's wall time, the first ``warmup`` of
them left out of the figures. Ratios are the baseline's median time over the contender's.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson


@dataclass(frozen=True)
class Comparison:
    name: str
    unit: str
    amount: float
    baseline: str
    seconds: dict[str, list[float]]
    warmup: int
    bytes: int | None = None
    notes: dict[str, str] = field(default_factory=dict)
    """A contender's remark for the table (e.g. why it did not run)."""

    def measured(self, contender: str) -> list[float]:
        return self.seconds[contender][self.warmup :]

    def median(self, contender: str) -> float:
        return statistics.median(self.measured(contender))

    def rate(self, contender: str) -> float:
        return self.amount / self.median(contender)

    def ratio(self, contender: str) -> float:
        """How many times faster than the baseline, median against median."""
        return self.median(self.baseline) / self.median(contender)

    def round_ratios(self, contender: str) -> list[float]:
        return [b / c for b, c in zip(self.measured(self.baseline), self.measured(contender), strict=True)]


def write(path: Path, comparisons: list[Comparison]) -> None:
    path.write_bytes(orjson.dumps([asdict(c) for c in comparisons], option=orjson.OPT_INDENT_2))


def read(path: Path) -> list[Comparison]:
    return [Comparison(**item) for item in orjson.loads(path.read_bytes())]
