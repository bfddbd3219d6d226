"""Who may decide what an `approve` rule holds, how freshly they must have signed in,
and which group is told: the rule keys `approvers`, `step_up` and `notify`.

    [[rules]]
    effect = "git.push"
    action = "approve"
    approvals = 2
    approvers = ["group:platform", "alice"]   # any two people of the group or the list
    step_up = "10m"             # or true (15 min), or { max_age = "5m", acr = [...], amr = [...] }
    notify = "platform"         # [notify.groups.platform] is told (Slack channel, webhooks)

The terms are recorded with the verdict (`Verdict.approvers`, `.step_up`, `.notify`) and
read back by broker.approval.eligibility when someone decides.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from broker.clock import parse_duration
from broker.errors import DecisionError, PolicyError
from broker.identity import approver_name

__all__ = ["DECIDER_KEYS", "GROUP", "StepUp", "parse_approvers", "parse_notify", "parse_step_up"]

DECIDER_KEYS = ("approvers", "step_up", "notify")
GROUP = "group:"
GROUP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@:/ -]{0,127}")
DEFAULT_MAX_AGE_S = 900.0
STEP_UP_KEYS = {"max_age", "acr", "amr"}


@dataclass(frozen=True)
class StepUp:
    """A recent sign-in (within `max_age_s`) and, where listed, an `acr` among these or
    every one of these `amr` methods, as the provider reports them."""

    max_age_s: float = DEFAULT_MAX_AGE_S
    acr: tuple[str, ...] = ()
    amr: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"max_age_s": self.max_age_s, "acr": list(self.acr), "amr": list(self.amr)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StepUp:
        return cls(
            float(data.get("max_age_s", DEFAULT_MAX_AGE_S)),
            tuple(str(v) for v in data.get("acr", ())),
            tuple(str(v) for v in data.get("amr", ())),
        )


def parse_approvers(where: str, value: Any) -> tuple[str, ...]:
    """`["group:platform", "alice"]`: groups as the provider names them, people
    normalised as a quorum counts them."""
    if value is None:
        return ()
    if not isinstance(value, list) or not value:
        raise PolicyError(f'{where}: a list of approvers and groups, e.g. ["group:ops", "alice"]')
    found: list[str] = []
    for item in value:
        if not isinstance(item, str):
            raise PolicyError(f"{where}: {item!r} is not a name or a group")
        if item.startswith(GROUP):
            group = item[len(GROUP) :]
            if not GROUP_NAME.fullmatch(group):
                raise PolicyError(f"{where}: {item!r} names no group")
            found.append(item)
            continue
        try:
            found.append(approver_name(item))
        except DecisionError as exc:
            raise PolicyError(f"{where}: {exc}") from exc
    return tuple(found)


def parse_step_up(where: str, value: Any) -> StepUp | None:
    """true (15 minutes), a duration, or a table of max_age, acr and amr."""
    if value is None or value is False:
        return None
    if value is True:
        return StepUp()
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return StepUp(_max_age(where, value))
    if not isinstance(value, Mapping):
        raise PolicyError(f'{where}: true, a duration ("10m") or a table of max_age, acr, amr')
    unknown = set(value) - STEP_UP_KEYS
    if unknown:
        raise PolicyError(f"{where}: unknown key {sorted(unknown)[0]!r}")
    lists = {}
    for key in ("acr", "amr"):
        items = value.get(key, [])
        if not isinstance(items, list) or not all(isinstance(v, str) and v for v in items):
            raise PolicyError(f"{where}.{key}: a list of the provider's values")
        lists[key] = tuple(items)
    return StepUp(_max_age(where, value.get("max_age", DEFAULT_MAX_AGE_S)), **lists)


def _max_age(where: str, value: Any) -> float:
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise PolicyError(f"{where}: {exc}") from exc
    if seconds <= 0:
        raise PolicyError(f"{where}: max_age must be more than 0 s")
    return seconds


def parse_notify(where: str, value: Any) -> str | None:
    """The group told of a waiting request ([notify.groups.NAME] in broker.toml)."""
    if value is None:
        return None
    name = value.removeprefix(GROUP) if isinstance(value, str) else None
    if name is None or not GROUP_NAME.fullmatch(name):
        raise PolicyError(f'{where}: the name of a group under [notify.groups], e.g. "platform"')
    return name
