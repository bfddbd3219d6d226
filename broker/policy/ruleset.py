"""Rules a reviewer can read in a code review, turned into a verdict per request.

Ordered rules; the first whose `effect` glob and `when` conditions match decides.
With no matching rule: reversible effects apply automatically, the rest wait for a
person for one hour and are then denied. Then, in order:

- a remembered rule people accepted (broker.policy.controls) may decide instead, unless a
  deny rule of the file matches too (a deny always wins over a remembered allow);
- `[[limits]]` (broker.policy.quotas): beyond a sandbox's quota or rate, the limit's action
  (a person, or a denial) stands in for the verdict;
- a request whose change touches a protected path (the handler's `protected_for`) waits
  for a person whatever the rule says, unless that rule names each such path in its own
  `protected_paths`; a deny still denies.

A rule's `after` conditions look at the sandbox's earlier effects (broker.policy.history).
`classify` is a pure function of the request, its facts and that history.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from broker.clock import parse_duration
from broker.errors import PolicyError
from broker.models import Verdict
from broker.policy.history import NO_HISTORY, History
from broker.policy.parsing import parse_rule
from broker.policy.quotas import Limit, exceeded, parse_limits
from broker.policy.rules import ACTIONS, DEFAULT_TIMEOUT_S, After, Reversibility, Rule

__all__ = [
    "ACTIONS",
    "After",
    "Policy",
    "Rule",
    "batch_allowed",
    "load_policy",
    "parse_duration",
    "parse_policy",
    "remembered_rule",
    "slack_buttons",
]

PROTECTED_RULE = "protected_paths"


@dataclass(frozen=True)
class Policy:
    """The loaded rules; `classify` is the only thing the pipeline asks of it."""

    rules: tuple[Rule, ...] = ()
    source: str = "(no policy file: defaults only)"
    warnings: tuple[str, ...] = ()  # rules that never decide (broker.policy.check)
    limits: tuple[Limit, ...] = ()
    remembered: tuple[Rule, ...] = ()  # accepted proposals (broker.policy.controls)

    def with_remembered(self, rules: Sequence[Rule]) -> Policy:
        return replace(self, remembered=tuple(rules))

    def classify(
        self,
        effect: str,
        params: Mapping[str, Any],
        reversible: bool,
        protected: Sequence[str] = (),
        history: History = NO_HISTORY,
    ) -> Verdict:
        return self.explain(effect, params, reversible, protected, history)[0]

    def explain(
        self,
        effect: str,
        params: Mapping[str, Any],
        reversible: bool,
        protected: Sequence[str] = (),
        history: History = NO_HISTORY,
    ) -> tuple[Verdict, list[str]]:
        """The verdict and one line per rule tried, up to the one that decided, then a
        line for each later step that changed it (a remembered rule, a limit,
        protected paths)."""
        lines: list[str] = []
        decided: Rule | None = None
        for rule in self.rules:
            hit = rule.matches(effect, params, history)
            lines.append(
                f"{rule.label} ({rule.action}): {'MATCH' if hit else 'no'}: "
                f"{rule.explain(effect, params, history)}"
            )
            if hit:
                decided = rule
                break
        if decided is None:
            verdict = default_verdict(reversible)
            lines.append(f"default ({verdict.action}): {verdict.reason}")
        else:
            verdict = decided.verdict()
        if verdict.action != "deny" and self.remembered:
            verdict, decided = self._remembered(
                verdict, decided, effect, params, reversible, history, lines
            )
        if verdict.action != "deny" and self.limits:
            verdict = _limited(verdict, self.limits, effect, history, lines)
        return _guarded(verdict, decided, protected, lines)

    def _remembered(
        self,
        verdict: Verdict,
        decided: Rule | None,
        effect: str,
        params: Mapping[str, Any],
        reversible: bool,
        history: History,
        lines: list[str],
    ) -> tuple[Verdict, Rule | None]:
        """A remembered allow decides instead, unless any deny rule of the file matches."""
        rule = next((r for r in self.remembered if r.matches(effect, params, history)), None)
        if rule is None:
            return verdict, decided
        if rule.reversible_only and not reversible:
            lines.append(
                f"{rule.label} (auto): not used: it was remembered from a reversible "
                "request, and this one cannot be undone"
            )
            return verdict, decided
        deny = next(
            (r for r in self.rules if r.action == "deny" and r.matches(effect, params, history)),
            None,
        )
        if deny is not None:
            lines.append(f"{rule.label} (auto): MATCH, overruled: {deny.label} denies (deny wins)")
            return deny.verdict(), deny
        lines.append(f"{rule.label} (auto): MATCH: {rule.explain(effect, params, history)}")
        return rule.verdict(), rule


def _limited(
    verdict: Verdict, limits: Sequence[Limit], effect: str, history: History, lines: list[str]
) -> Verdict:
    """Beyond a quota or rate: the limit's action stands in (a person, or a denial)."""
    hit = exceeded(limits, effect, history)
    if hit is None:
        return verdict
    limit, why = hit
    reason = f"{why}; {limit.reason}" if limit.reason else why
    lines.append(f"{limit.label} ({limit.action}): {reason}")
    if limit.action == "deny":
        return Verdict("deny", limit.label, f"{reason}; wait before asking again")
    if verdict.action == "approve":
        return replace(verdict, reason=f"{verdict.reason}; {reason}")
    return Verdict(
        "approve",
        limit.label,
        f"{reason}: a person decides beyond it",
        timeout_s=DEFAULT_TIMEOUT_S,
        on_timeout="deny",
        batch=False,
    )


def _guarded(
    verdict: Verdict, rule: Rule | None, protected: Sequence[str], lines: list[str]
) -> tuple[Verdict, list[str]]:
    """A protected path not named by the deciding rule makes a person decide."""
    unnamed = [p for p in protected if rule is None or not rule.names(p)]
    if not unnamed or verdict.action == "deny":
        return verdict, lines
    shown = ", ".join(unnamed[:10]) + (
        f" and {len(unnamed) - 10} more" if len(unnamed) > 10 else ""
    )
    reason = (
        f"the change touches protected paths ({shown}); a person must approve it whatever "
        f"the rules say ({verdict.rule} said {verdict.action})"
    )
    timeout = verdict.timeout_s if verdict.action == "approve" else DEFAULT_TIMEOUT_S
    guarded = replace(
        verdict,
        action="approve",
        rule=f"{verdict.rule}+{PROTECTED_RULE}",
        reason=reason,
        timeout_s=timeout,
        on_timeout="deny",
        batch=False,
        slack_buttons=False,
        slack_buttons_irreversible=False,
    )
    lines.append(f"{PROTECTED_RULE} (approve): {reason}")
    return guarded, lines


def default_verdict(reversible: bool) -> Verdict:
    if reversible:
        return Verdict("auto", "default", "no rule matched; reversible effects apply at once")
    return Verdict(
        "approve",
        "default",
        "no rule matched; irreversible effects wait for a person",
        approvals=1,
        timeout_s=DEFAULT_TIMEOUT_S,
        on_timeout="deny",
    )


def load_policy(
    path: Path | None,
    reversible: Reversibility,
    schemas: Mapping[str, Mapping[str, Any]] | None = None,
) -> Policy:
    """Read and check a policy file; a fault names the rule and the key. With the
    registered effects' `schemas`, unknown effects and params are refused too."""
    if path is None:
        return Policy()
    from broker.inputs import read_toml

    data = read_toml(path, PolicyError, "policy file")
    return parse_policy(data, reversible, str(path), schemas)


def parse_policy(
    data: Mapping[str, Any],
    reversible: Reversibility,
    source: str,
    schemas: Mapping[str, Mapping[str, Any]] | None = None,
) -> Policy:
    extra = set(data) - {"rules", "limits"}
    if extra:
        raise PolicyError(f"{source}: unknown top-level key {sorted(extra)[0]!r}")
    raw_rules = data.get("rules", [])
    if not isinstance(raw_rules, list):
        raise PolicyError(f"{source}: 'rules' must be an array of tables ([[rules]])")
    rules = tuple(parse_rule(i, raw, reversible, source) for i, raw in enumerate(raw_rules))
    limits = parse_limits(data.get("limits", []), source)
    if schemas is None:
        return Policy(rules, source, limits=limits)
    from broker.policy.check import check_limits, check_rules

    check_limits(limits, schemas, source)
    return Policy(rules, source, tuple(check_rules(rules, schemas, source)), limits)


def remembered_rule(number: int, raw: Any, reversible_only: bool = False) -> Rule:
    """An accepted proposal as a rule: an `auto` rule on one effect, naming no protected
    path (those stay with people). Drafted from a reversible request, it decides only
    reversible ones: approving a new file says nothing about overwriting it."""
    rule = parse_rule(number, raw, {}, "remembered rule", kind="remembered")
    if rule.action != "auto" or rule.protected_paths or any(c in rule.effect for c in "*?["):
        raise PolicyError(
            f"remembered[{number}]: a remembered rule is an auto rule on one effect "
            "that names no protected path"
        )
    return replace(rule, reversible_only=reversible_only)


def slack_buttons(verdict: Mapping[str, Any] | None, reversible: bool | None) -> bool:
    """Whether a recorded verdict lets Slack carry Approve/Deny buttons for this request:
    only when its rule says so, and on an irreversible request only when it says that too."""
    terms = verdict or {}
    if terms.get("action") != "approve" or terms.get("slack_buttons") is not True:
        return False
    return reversible is True or terms.get("slack_buttons_irreversible") is True


def batch_allowed(verdict: Mapping[str, Any] | None) -> bool:
    """Whether a recorded verdict lets a person decide the request within a selection."""
    return (verdict or {}).get("batch", True) is not False
