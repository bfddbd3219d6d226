"""Staged mode: every request is received, validated, classified and previewed, and
nothing is applied. For trying a new integration or a new policy on real agents.

    [broker]
    staged = true                              # every effect
    staged = ["github.*", "s3.put_object"]     # only these (effect globs)

A staged request ends `staged` (a terminal status of PROTOCOL.md): its result's `output`
holds the verdict that would have applied and the preview a person would have seen. A
would-be denial is staged too (with verdict `deny`); an invalid request is still
`invalid`. Staged requests never wait for people nor count against the pending cap.
A request staged stays staged: turning staged mode off later changes nothing about it.
"""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any, NamedTuple

from broker.errors import ConfigError

if TYPE_CHECKING:  # the config loads this module: `broker run` needs no more of it
    from broker.models import Verdict

__all__ = ["EVERY", "OFF", "Staged", "output", "reason"]

KEY = "broker.staged"


class Staged(NamedTuple):
    """Which effects are staged: globs on effect names (`*` for every effect)."""

    globs: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.globs)

    def covers(self, effect: str | None) -> bool:
        return effect is not None and any(fnmatchcase(effect, g) for g in self.globs)

    def describe(self) -> str:
        return "every effect" if self.globs == ("*",) else ", ".join(self.globs)

    @classmethod
    def parse(cls, value: Any) -> Staged:
        """`[broker] staged`: true, false, or a non-empty list of effect globs."""
        if isinstance(value, bool):
            return EVERY if value else OFF
        if isinstance(value, list) and value:
            globs = []
            for glob in value:
                if not isinstance(glob, str) or not glob.strip():
                    break
                globs.append(glob.strip())
            else:
                return cls(tuple(globs))
        raise ConfigError(
            f'{KEY}: expected true, false or a list of effect globs (["github.*", '
            f'"s3.put_object"]), got {value!r}'
        )

    def check(self, names: Iterable[str]) -> None:
        """A glob that matches no registered effect is a typo that would stage nothing:
        refused at start, naming it."""
        known = list(names)
        for glob in self.globs:
            if not any(fnmatchcase(name, glob) for name in known):
                raise ConfigError(
                    f"{KEY}: {glob!r} matches no registered effect "
                    f"(known: {', '.join(sorted(known))})"
                )


EVERY = Staged(("*",))
OFF = Staged()


def output(verdict: Verdict, preview: dict[str, Any]) -> dict[str, Any]:
    """A staged result's `output` (PROTOCOL.md): the verdict that would have applied,
    and the preview."""
    return {"staged": True, "verdict": verdict.to_json(), "preview": preview}


def reason(verdict: Verdict) -> str:
    """What the agent reads: nothing happened, and what would have."""
    would = {
        "auto": "apply it automatically",
        "approve": f"have it wait for {verdict.approvals} approval(s) by a person",
        "deny": "deny it",
    }.get(verdict.action, verdict.action)
    return (
        "staged: this host runs in staged mode, so nothing was applied; the policy would "
        f"{would} ({verdict.rule}: {verdict.reason}). output.preview shows what it would "
        "do; treat the request as not done"
    )
