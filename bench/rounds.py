"""A run's samples by round: every cell's figures tagged with the round they came
from, and each round's probes and verdict (bench.quiet).

A figure of the table is the median over the quiet rounds; a ratio is the median of
the per-round ratios of the quiet rounds (both cells from the same round).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import fsprobe, quiet
from bench.stats import Figure


@dataclass
class Round:
    part: str  # "sequential", "burst", "sandbox", "start", ...
    before: dict[str, float]
    after: dict[str, float] = field(default_factory=dict)
    judged: quiet.Judged = quiet.UNJUDGED

    def to_json(self) -> dict[str, Any]:
        return {"part": self.part, "before": self.before, "after": self.after}


class Run:
    """Everything measured in one invocation, by row label and by round."""

    def __init__(self, probes_dir: Path, limits: quiet.Limits = quiet.LIMITS) -> None:
        self.samples: dict[str, list[dict[str, Any]]] = {}
        self.rounds: list[Round] = []
        self.notes: list[str] = []
        self.limits = limits
        self.own_pids: Callable[[], list[int]] = list  # the bench's own running servers
        self._dir = probes_dir
        self._current = -1

    def probe(self, window: bool = True, *, settle: bool = False) -> dict[str, float]:
        """A probe (bench.fsprobe); with `settle`, taken once the container engine is
        idle (rounds of containers), and the wait recorded as engine_settle_s."""
        waited = fsprobe.settle_engine() if settle else 0.0
        found = fsprobe.probe(self._dir, own=self.own_pids(), window=window)
        return {**found, "engine_settle_s": waited} if settle else found

    @contextmanager
    def round(self, part: str, *, own_known: bool = True) -> Iterator[int]:
        """Cells measured inside belong to one round, probed before and after (once
        the engine has settled, when the round's work ran in containers)."""
        self.rounds.append(Round(part, self.probe(settle=not own_known)))
        self._current = len(self.rounds) - 1
        try:
            yield self._current
        finally:
            done = self.rounds[self._current]
            done.after = self.probe(settle=not own_known)
            done.judged = quiet.judge(done.before, done.after, self.limits, own_known=own_known)
            self._current = -1

    def add(self, label: str, sample: dict[str, Any]) -> None:
        self.samples.setdefault(label, []).append({**sample, "round": self._current})

    def quiet(self, label: str | None = None) -> dict[int, bool]:
        """Round → quiet, for the rounds `label` has samples in (every round if None)."""
        wanted = None if label is None else {s["round"] for s in self.samples.get(label, [])}
        return {
            i: r.judged.quiet for i, r in enumerate(self.rounds) if wanted is None or i in wanted
        }

    def by_round(self, label: str, key: str) -> dict[int, float]:
        """Round → the figure `key` of `label` in that round (the last, if several)."""
        return {s["round"]: float(s[key]) for s in self.samples.get(label, []) if key in s}

    def figure(self, label: str, key: str, *, quiet_only: bool = True) -> Figure:
        """The runs of `label`'s `key` from its quiet rounds (all, when none was quiet
        or `quiet_only` is False: see `noisy`)."""
        found = self.by_round(label, key)
        calm = self.quiet(label)
        kept = [v for r, v in found.items() if calm.get(r)] if quiet_only else []
        return Figure(tuple(kept or found.values()))

    def noisy(self, label: str, key: str) -> bool:
        """Whether `label`'s `key` had no quiet round (its figure is from noisy ones)."""
        calm = self.quiet(label)
        return not any(calm.get(r) for r in self.by_round(label, key))

    def ratio(self, label: str, key: str, base: str, base_key: str | None = None) -> float:
        """The median of the per-round ratios over the quiet rounds (NaN when none)."""
        values = quiet.per_round_ratio(
            self.by_round(label, key), self.by_round(base, base_key or key)
        )
        return quiet.quiet_median(values, self.quiet())

    def rounds_of(self, label: str, key: str) -> str:
        """ "2/3" (quiet rounds of all the rounds `label`'s `key` was measured in)."""
        calm = self.quiet(label)
        found = self.by_round(label, key)
        return f"{sum(bool(calm.get(r)) for r in found)}/{len(found)}" if found else ""

    def rounds_json(self) -> list[dict[str, Any]]:
        return [{**r.to_json(), **r.judged.to_json()} for r in self.rounds]
