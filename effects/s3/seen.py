"""What the broker saw of a request's objects when it classified the request
(`reversible_for`) and, for a request a person decides, when it computed the preview.

It is kept with the request (`ctx.remember`; the broker drops it when the request
ends) for `apply` to hold the write to. What a person saw outranks a later
classification: a re-classified request keeps the approver's observation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from broker.typing import JSON
from effects.base import Context
from effects.s3.state import State


@dataclass(frozen=True)
class Seen:
    """What the broker observed about a request's objects, and at which stage."""

    stage: str  # "policy" (classified) | "approver" (the preview a person saw)
    target: State
    source: State | None = None

    @property
    def who(self) -> str:
        if self.stage == "approver":
            return "it was shown to the approver"
        return "the broker classified this request"

    def to_json(self) -> JSON:
        return {
            "stage": self.stage,
            "target": self.target.to_json(),
            "source": self.source.to_json() if self.source else None,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Seen:
        source = data.get("source")
        return cls(
            str(data["stage"]),
            State.from_json(data["target"]),
            State.from_json(source) if source else None,
        )


def remember(ctx: Context, seen: Seen) -> None:
    """Keep what was observed until apply; what a person saw is never replaced by a
    later classification."""
    if seen.stage == "policy" and (kept := recall(ctx)) and kept.stage == "approver":
        return
    ctx.remember(seen.to_json())


def recall(ctx: Context) -> Seen | None:
    """What was observed, or None (nothing was, or it is unreadable: apply then holds
    the weaker condition)."""
    data = ctx.recall()
    if not data:
        return None
    try:
        return Seen.from_json(data)
    except (KeyError, TypeError, ValueError):
        return None
