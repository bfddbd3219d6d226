"""What an approver reads about an object: its text (or a diff), its state, what undo
can do, and whether the agent's condition holds."""

from __future__ import annotations

import difflib

from broker.typing import Params
from effects.s3.conditions import agent_condition, holds, words
from effects.s3.state import SHOW_MAX, State


def as_text(data: bytes | None) -> str | None:
    if data is None or len(data) > SHOW_MAX:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return None if "\x00" in text else text


def shown_body(old: bytes | None, new: bytes | None, target: str, new_size: int) -> tuple[str, str]:
    """(body, body_kind): a diff of old and new text, the new text, or what it is."""
    old_text, new_text = as_text(old), as_text(new)
    if new_text is None:
        return f"({new_size} bytes, binary or larger than {SHOW_MAX} bytes: not shown)", "text"
    if old_text is None or old_text == new_text:
        return new_text, "text"
    diff = difflib.unified_diff(
        old_text.splitlines(keepends=True),
        new_text.splitlines(keepends=True),
        fromfile=f"{target} (now)",
        tofile=f"{target} (after)",
    )
    return "".join(diff), "diff"


VERSIONING = {
    "Enabled": "enabled",
    "Suspended": "suspended (treated as off)",
    "off": "off",
    "unknown": "unknown: the host may not read it (treated as off)",
}


def state_facts(state: State, label: str = "current") -> list[tuple[str, str]]:
    if not state.exists:
        return [("exists", "no: a new object")]
    return [
        ("exists", "yes"),
        (f"{label} size", f"{state.size} bytes"),
        (f"{label} ETag", str(state.etag)),
        (f"{label} version", state.version_id or "none (unversioned)"),
    ]


def write_undo(state: State, params: Params) -> tuple[bool, str]:
    """(reversible, the words for the approver) for a put or copy onto `state`."""
    if params.get("if_none_match") == "*" and state.exists:
        return True, "none needed: the key exists, so this write will fail (if_none_match)"
    if state.versioned:
        after = f"; version {state.version_id} is current again" if state.exists else ""
        return True, f"reversible: the bucket keeps versions; undo removes the new one{after}"
    if not state.exists:
        return True, "reversible: a new key; undo deletes it"
    return False, "IRREVERSIBLE: the bucket keeps no versions; the current content is lost"


def condition_fact(params: Params, state: State) -> list[tuple[str, str]]:
    agent = agent_condition(params)
    if not agent:
        return []
    now = "holds now" if holds(agent, state) else f"FAILS now: the object {state.describe()}"
    return [("condition", f"{words(agent)}: {now}")]
