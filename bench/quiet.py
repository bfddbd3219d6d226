"""Whether a round of the bench ran on a quiet machine, and what its figures may claim.

A round is a set of cells run back to back (every server of the plan once), with a
probe just before and just after it (bench.fsprobe: µs per small-file create and per
fsync, the CPU others used and the steal during a short idle window, the load
average). A round is quiet when both probes are, and when the CPU used by processes
other than the bench's own during the round stayed low. Only quiet rounds make
figures: a ratio is the median of per-round ratios (each taken from two cells of the
same round), printed with the rounds it came from, and a target is "inconclusive"
when too few rounds were quiet, or when the quiet rounds disagree about it.

Everything here is a pure function of the probes' numbers, so tests feed it
deterministic inputs.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Probe = Mapping[str, float]
"""One probe (bench.fsprobe.probe): create_p50_us, fsync_p50_us, others_cores,
steal_share, loadavg_1m; and the counters `busy_s`, `steal_s`, `own_s`, `wall_s`
(whole-machine non-idle CPU, steal, the bench's own CPU, a monotonic time) that two
probes turn into the CPU others used between them."""


@dataclass(frozen=True)
class Limits:
    """What counts as quiet on this machine (two cores, ext4): measured in quiet
    minutes, creates take 15–25 µs and fsyncs 100–250 µs; in slow phases 125–700 µs
    and 1–4 ms."""

    create_us: float = 60.0
    fsync_us: float = 600.0
    others_cores: float = 0.35  # CPU others use, in cores (at a probe, or over the round)
    steal_share: float = 0.05  # of the CPU time, taken by the hypervisor
    drift: float = 3.0  # the after-probe's create or fsync against the before-probe's


LIMITS = Limits()


@dataclass(frozen=True)
class Judged:
    """A round's verdict: quiet or not, and why not (one phrase per reason)."""

    quiet: bool
    why: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"quiet": self.quiet, "why": list(self.why)}


UNJUDGED = Judged(False, ("not finished",))


def _probe_noise(p: Probe, when: str, limits: Limits) -> list[str]:
    why = []
    if p.get("create_p50_us", 0.0) > limits.create_us:
        why.append(f"create {p['create_p50_us']:.0f} µs > {limits.create_us:.0f} ({when})")
    if p.get("fsync_p50_us", 0.0) > limits.fsync_us:
        why.append(f"fsync {p['fsync_p50_us']:.0f} µs > {limits.fsync_us:.0f} ({when})")
    if p.get("others_cores", 0.0) > limits.others_cores:
        why.append(f"others used {p['others_cores']:.2f} cores ({when})")
    if p.get("steal_share", 0.0) > limits.steal_share:
        why.append(f"steal {p['steal_share'] * 100:.0f}% ({when})")
    return why


def others_between(before: Probe, after: Probe) -> float:
    """Cores' worth of CPU used between two probes by processes other than the bench's
    own (the machine's non-idle time less the bench's, per second of wall time)."""
    wall = after.get("wall_s", 0.0) - before.get("wall_s", 0.0)
    if wall <= 0 or "busy_s" not in before or "busy_s" not in after:
        return float("nan")
    busy = after["busy_s"] - before["busy_s"]
    own = after.get("own_s", 0.0) - before.get("own_s", 0.0)
    return max(0.0, busy - own) / wall


def judge(
    before: Probe, after: Probe, limits: Limits = LIMITS, *, own_known: bool = True
) -> Judged:
    """A round between two probes. `own_known` is False when the round's work runs in
    processes the bench cannot count as its own (containers): the CPU others used
    during it is then not judged, only the probes at its edges."""
    why = _probe_noise(before, "before", limits) + _probe_noise(after, "after", limits)
    for key, name in (("create_p50_us", "create"), ("fsync_p50_us", "fsync")):
        a, b = before.get(key, 0.0), after.get(key, 0.0)
        if min(a, b) > 0 and max(a, b) / min(a, b) > limits.drift:
            why.append(f"{name} moved {a:.0f} → {b:.0f} µs during the round")
    if own_known:
        during = others_between(before, after)
        if during == during and during > limits.others_cores:
            why.append(f"others used {during:.2f} cores during the round")
    return Judged(not why, tuple(why))


Status = Literal["met", "missed", "inconclusive"]


@dataclass(frozen=True)
class Outcome:
    """A target judged from the quiet rounds: the figure (median of per-round values),
    the rounds it came from (by round number), and how many rounds there were."""

    status: Status
    value: float
    used: tuple[int, ...]
    rounds: int
    values: tuple[float, ...] = field(default=())
    note: str = ""
    counted: bool = False  # a count (memory, CPU while idle): noise not judged

    def rounds_text(self) -> str:
        """e.g. "2 of 4 rounds quiet (rounds 3, 5)": how many of the target's rounds
        were quiet, and which, by their number in the run (its "rounds" list)."""
        if self.counted:
            return f"{self.rounds} round{'s' if self.rounds > 1 else ''}, noise not judged"
        if not self.used:
            return f"no quiet round of {self.rounds}"
        if len(self.used) == self.rounds and self.rounds > 1:
            return f"all {self.rounds} rounds quiet"
        listed = ", ".join(str(r + 1) for r in self.used)
        which = f"round{'s' if len(self.used) > 1 else ''} {listed}"
        of = f"{self.rounds} round{'s' if self.rounds > 1 else ''}"
        return f"{len(self.used)} of {of} quiet ({which})"


def need_quiet(rounds: int) -> int:
    """How many quiet rounds a timed target needs: at least two, and half of them."""
    return max(2, math.ceil(rounds / 2))


def decide(
    by_round: Mapping[int, float],
    quiet: Mapping[int, bool],
    limit: float,
    *,
    at_most: bool = True,
    need: int | None = None,
    strict: bool = False,
) -> Outcome:
    """Met, missed or inconclusive for `value ≤ limit` (or ≥ when `at_most` is False;
    < or > when `strict`), from the per-round values of the quiet rounds only. The quiet
    rounds must agree: when some meet the limit and others miss it, the outcome is
    inconclusive."""
    rounds = len(quiet)
    used = tuple(sorted(r for r, v in by_round.items() if quiet.get(r) and v == v))
    values = tuple(by_round[r] for r in used)
    want = need_quiet(rounds) if need is None else need
    if len(used) < want:
        value = statistics.median(values) if values else float("nan")
        note = f"{len(used)} quiet round{'s' if len(used) != 1 else ''}, {want} needed"
        return Outcome("inconclusive", value, used, rounds, values, note)
    value = statistics.median(values)
    if strict:
        passes = [v < limit if at_most else v > limit for v in values]
    else:
        passes = [v <= limit if at_most else v >= limit for v in values]
    if all(passes):
        return Outcome("met", value, used, rounds, values)
    if not any(passes):
        return Outcome("missed", value, used, rounds, values)
    return Outcome("inconclusive", value, used, rounds, values, "the quiet rounds disagree")


def per_round_ratio(values: Mapping[int, float], bases: Mapping[int, float]) -> dict[int, float]:
    """value / base for each round that has both (a ratio never mixes two rounds)."""
    return {
        r: values[r] / bases[r] for r in values if r in bases and bases[r] and bases[r] == bases[r]
    }


def quiet_median(by_round: Mapping[int, float], quiet: Mapping[int, bool]) -> float:
    """The median over the quiet rounds (NaN when none was)."""
    kept = [v for r, v in by_round.items() if quiet.get(r) and v == v]
    return statistics.median(kept) if kept else float("nan")


def summary(judged: Sequence[Judged]) -> str:
    """e.g. "1 of 4 rounds quiet (noisy: create ×3, others ×2)": what made the others
    noisy, by the first word of each reason, commonest first."""
    quiet = sum(j.quiet for j in judged)
    reasons: dict[str, int] = {}
    for j in judged:
        for kind in {w.split(" ")[0] for w in j.why}:
            reasons[kind] = reasons.get(kind, 0) + 1
    text = f"{quiet} of {len(judged)} rounds quiet"
    if reasons:
        common = sorted(reasons.items(), key=lambda kv: -kv[1])[:3]
        text += " (noisy: " + ", ".join(f"{k} ×{n}" for k, n in common) + ")"
    return text
