"""Percentiles within a run, medians and spreads across runs, ratios to the baseline."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class Figure:
    """One number of the table: a median over runs and the runs' min and max."""

    runs: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.runs) if self.runs else float("nan")

    @property
    def low(self) -> float:
        return min(self.runs) if self.runs else float("nan")

    @property
    def high(self) -> float:
        return max(self.runs) if self.runs else float("nan")

    def show(self, scale: float = 1.0, digits: int = 2) -> str:
        if not self.runs:
            return "—"
        m, lo, hi = self.median * scale, self.low * scale, self.high * scale
        if len(self.runs) == 1:
            return f"{m:.{digits}f}"
        return f"{m:.{digits}f} ({lo:.{digits}f}–{hi:.{digits}f})"

    def to_json(self) -> dict[str, object]:
        return {"median": self.median, "min": self.low, "max": self.high, "runs": self.runs}


def ratio(value: Figure, base: Figure) -> float:
    if not value.runs or not base.runs or base.median == 0:
        return float("nan")
    return value.median / base.median
