"""What a sandbox did before the request at hand, for the rules that depend on it:
quotas and rate limits (`[[limits]]`, broker.policy.quotas) and history conditions (a rule's
`after`). Built lazily: the ledger is read only when a rule that needs it is tried.

A past request counts toward a quota from the moment it passed the gate (received,
waiting for people, applying, applied, failed, unknown) until a person or the policy
refuses it; it counts as an earlier *effect* (for `after`) once it may have happened:
approved, applying, applied, failed or unknown.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from broker import clock

__all__ = ["HAPPENED", "USED", "History", "Past", "past_of"]

USED = frozenset({"received", "pending", "approved", "applying", "applied", "failed", "unknown"})
HAPPENED = frozenset({"approved", "applying", "applied", "failed", "unknown"})


@dataclass(frozen=True)
class Past:
    """One earlier request of the sandbox, as the rules see it."""

    effect: str
    params: Mapping[str, Any]
    state: str
    received: float  # seconds since the epoch


def past_of(records: Iterable[Any]) -> list[Past]:
    """Past requests from ledger records (`broker.models.Record`), oldest first."""
    found = []
    for record in records:
        if not record.effect or record.payload is None:
            continue
        received = clock.parse_iso(record.received_at)
        found.append(
            Past(
                record.effect,
                record.envelope.get("params") or {},
                record.state,
                received.timestamp() if received else 0.0,
            )
        )
    return found


@dataclass
class History:
    """The earlier requests of one sandbox, read on first use, and the time it is now
    for them (the request's own time, in a replay)."""

    load: Callable[[], Sequence[Past]] = tuple
    now: float = field(default_factory=lambda: clock.now().timestamp())
    _past: Sequence[Past] | None = None

    @property
    def past(self) -> Sequence[Past]:
        if self._past is None:
            self._past = tuple(self.load())
        return self._past

    def used(self, effect_glob: str, window_s: float | None = None) -> int:
        """How many earlier requests matching `effect_glob` count toward a quota (within
        the last `window_s` seconds, if given)."""
        since = self.now - window_s if window_s is not None else None
        return sum(
            1
            for p in self.past
            if p.state in USED
            and fnmatchcase(p.effect, effect_glob)
            and (since is None or p.received > since)
        )

    def happened(
        self,
        effect_glob: str,
        matches: Callable[[Mapping[str, Any]], bool],
        within_s: float | None = None,
    ) -> Past | None:
        """The latest earlier effect matching `effect_glob` and `matches`, if any."""
        since = self.now - within_s if within_s is not None else None
        for p in reversed(self.past):
            if (
                p.state in HAPPENED
                and fnmatchcase(p.effect, effect_glob)
                and (since is None or p.received > since)
                and matches(p.params)
            ):
                return p
        return None


NO_HISTORY = History()
"""For a request with no sandbox behind it (`broker policy explain` on a file)."""
