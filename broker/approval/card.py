"""What the inbox adds to a request's card (broker.approval.decisions.card): the list's one-line
summary and markers, the result's output and whether it hides a service error, and the
filters a reviewer narrows the list with.

Pure functions over the card's dict; nothing here reads the ledger.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from broker.outcomes import service_warning


@dataclass(frozen=True)
class Narrowing:
    """The waiting list's filters; an empty one keeps everything."""

    effect: str | None = None
    sandbox: str | None = None
    text: str | None = None

    def keeps(self, card: Mapping[str, Any]) -> bool:
        if self.effect and card.get("effect") != self.effect:
            return False
        if self.sandbox and card.get("sandbox") != self.sandbox:
            return False
        if self.text:
            needle = self.text.casefold()
            return any(needle in str(v).casefold() for v in searchable(card))
        return True


def searchable(card: Mapping[str, Any]) -> Iterable[Any]:
    """The card's text a search looks in: ref, effect, what, where, why, the agent's words."""
    what = card.get("what") or {}
    why = card.get("why") or {}
    yield card.get("ref", "")
    yield card.get("effect") or ""
    yield what.get("title", "")
    yield what.get("body", "")
    yield card.get("where") or ""
    yield why.get("reason") or ""
    yield card.get("agent_reason") or ""
    for fact in what.get("facts") or []:
        yield " ".join(str(part) for part in fact)


def lines_of(body: str) -> int:
    """How many lines a body shows (a final newline ends a line, it does not start one)."""
    if not body:
        return 0
    return body.count("\n") + (0 if body.endswith("\n") else 1)


def change(what: Mapping[str, Any]) -> str:
    """The size of the change in a few words: "+3 −1 lines", "12 lines", "no body"."""
    body = str(what.get("body") or "")
    if not body:
        return "no body"
    if what.get("body_kind") == "diff":
        added = removed = 0
        for line in body.split("\n"):
            if line.startswith("+") and not line.startswith("+++"):
                added += 1
            elif line.startswith("-") and not line.startswith("---"):
                removed += 1
        return f"+{added} −{removed} lines"
    count = lines_of(body)
    return f"{count} line{'s' if count != 1 else ''}"


def markers(card: Mapping[str, Any]) -> list[str]:
    """The flags a reviewer must not miss: irreversible (or reversible), overwrite."""
    found = []
    if card.get("reversible") is False:
        found.append("irreversible")
    elif card.get("reversible") is True:
        found.append("reversible")
    what = card.get("what") or {}
    facts = {str(f[0]).lower(): str(f[1]) for f in what.get("facts") or [] if len(f) == 2}
    if facts.get("overwrite", "").startswith("yes") or str(what.get("title", "")).startswith(
        "overwrite "
    ):
        found.append("overwrite")
    return found


def output_text(output: Any) -> str:
    """The result's output as the reviewer reads it: indented JSON."""
    if output is None:
        return ""
    return json.dumps(output, indent=2, ensure_ascii=False, sort_keys=True)


def extend(card: dict[str, Any], output: Any) -> dict[str, Any]:
    """The card with what the inbox shows beside it (all derived, nothing new trusted)."""
    what = card.get("what") or {}
    card["summary"] = change(what)
    card["lines"] = lines_of(str(what.get("body") or ""))
    card["markers"] = markers(card)
    card["output"] = output
    card["warning"] = service_warning(str(card.get("status")), output)
    return card
