"""Quotas and rate limits per sandbox (`[[limits]]` in the policy): how many requests of
an effect glob one sandbox may make in its life (`max`) or per window (`rate =
"10/1h"`); beyond them the limit's `action` (a person decides, or a denial) stands in
for what the rules said. Counts come from the ledger, so they survive restarts."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from broker.clock import parse_duration
from broker.errors import PolicyError
from broker.policy.history import History
from broker.policy.parsing import checked_table, effect_glob

__all__ = ["LIMIT_KEYS", "Limit", "exceeded", "parse_limits"]

LIMIT_KEYS = {"effect", "max", "rate", "action", "reason"}
_RATE = re.compile(r"\s*(\d+)\s*/\s*(\S+)\s*")


@dataclass(frozen=True)
class Limit:
    """One `[[limits]]` table."""

    index: int
    effect: str
    action: str  # approve | deny
    max: int | None = None
    rate: tuple[int, float] | None = None  # (count, window in seconds)
    rate_text: str = ""
    reason: str = ""

    @property
    def label(self) -> str:
        return f"limits[{self.index}]"

    def over(self, effect: str, history: History) -> str | None:
        """Why `effect`'s next request is beyond this limit, or None."""
        if self.max is not None:
            used = history.used(self.effect, None)
            if used >= self.max:
                return (
                    f"quota: {used} of {self.max} {_what(self.effect, effect)} used in this sandbox"
                )
        if self.rate is not None:
            count, window = self.rate
            used = history.used(self.effect, window)
            if used >= count:
                return (
                    f"rate limit: {used} {_what(self.effect, effect)} in this sandbox within "
                    f"{self.rate_text.split('/', 1)[1].strip()} (at most {count})"
                )
        return None


def _what(glob: str, effect: str) -> str:
    return effect if glob == effect else f"{glob} requests"


def exceeded(limits: Sequence[Limit], effect: str, history: History) -> tuple[Limit, str] | None:
    """The limit that decides, if any: a deny limit before an approve one."""
    found = [
        (limit, why)
        for limit in limits
        if _applies(limit, effect) and (why := limit.over(effect, history)) is not None
    ]
    found.sort(key=lambda pair: pair[0].action != "deny")
    return found[0] if found else None


def _applies(limit: Limit, effect: str) -> bool:
    return fnmatchcase(effect, limit.effect)


def parse_limits(raw: Any, source: str) -> tuple[Limit, ...]:
    if not isinstance(raw, list):
        raise PolicyError(f"{source}: 'limits' must be an array of tables ([[limits]])")
    return tuple(_limit(i, item, f"{source}: limits[{i}]") for i, item in enumerate(raw))


def _limit(i: int, raw: Any, where: str) -> Limit:
    raw = checked_table(where, raw, LIMIT_KEYS)
    effect = effect_glob(where, raw, "the effect name")
    action = raw.get("action", "deny")
    if action not in ("approve", "deny"):
        raise PolicyError(f"{where}.action: must be 'approve' or 'deny'; got {action!r}")
    most = raw.get("max")
    if most is not None and (not isinstance(most, int) or isinstance(most, bool) or most < 0):
        raise PolicyError(f"{where}.max: must be a whole number ≥ 0")
    rate_text = raw.get("rate")
    rate = _rate(where, rate_text) if rate_text is not None else None
    if most is None and rate is None:
        raise PolicyError(f'{where}: give max (per sandbox) or rate ("10/1h"), or both')
    reason = raw.get("reason", "")
    if not isinstance(reason, str):
        raise PolicyError(f"{where}.reason: must be a string")
    return Limit(i, effect, action, most, rate, str(rate_text or ""), reason)


def _rate(where: str, text: Any) -> tuple[int, float]:
    found = _RATE.fullmatch(text) if isinstance(text, str) else None
    if found is None:
        raise PolicyError(f'{where}.rate: must read "COUNT/WINDOW", e.g. "10/1h"; got {text!r}')
    try:
        window = parse_duration(found[2])
    except ValueError as exc:
        raise PolicyError(f"{where}.rate: {exc}") from exc
    count = int(found[1])
    if count < 1 or window <= 0:
        raise PolicyError(f"{where}.rate: the count and the window must be above zero")
    return count, window
