"""The condition a write sends to S3 (If-Match or If-None-Match: *), and the reason a
412 gets: what a person saw, or what made an unversioned write reversible, must still
hold; else the agent's own condition; else the state read just before the write."""

from __future__ import annotations

from broker.errors import EffectFailed
from broker.typing import Params
from effects.s3.seen import Seen
from effects.s3.state import State

Condition = dict[str, str]  # {"IfMatch": etag} | {"IfNoneMatch": "*"} | {}


def expect(state: State) -> Condition:
    return {"IfMatch": state.etag or "*"} if state.exists else {"IfNoneMatch": "*"}


def unquote(etag: str | None) -> str:
    return (etag or "").strip().removeprefix("W/").strip('"')


def holds(cond: Condition, state: State) -> bool:
    if "IfMatch" in cond:
        return state.exists and unquote(cond["IfMatch"]) == unquote(state.etag)
    if "IfNoneMatch" in cond:
        return not state.exists
    return True


def agent_condition(params: Params) -> Condition:
    if "if_match" in params:
        return {"IfMatch": str(params["if_match"])}
    if params.get("if_none_match") == "*":
        return {"IfNoneMatch": "*"}
    return {}


def words(cond: Condition) -> str:
    if "IfMatch" in cond:
        return f"if_match {cond['IfMatch']}"
    return "if_none_match: * (the key must not exist)"


def condition(target: str, params: Params, seen: Seen | None, now: State) -> tuple[Condition, str]:
    """The condition a write sends, and the reason given when S3 refuses it (412)."""
    agent = agent_condition(params)
    if seen is not None and seen.target.versioned and not now.versioned:
        raise EffectFailed(
            f"failed: versioning of the bucket of {target} was turned off since {seen.who}; "
            "send the request again so that it is classified on the bucket as it is now"
        )
    # What a person approved, or what made an unversioned write reversible, must still hold.
    if seen is not None and (seen.stage == "approver" or not seen.target.versioned):
        was = seen.target
        if agent and not holds(agent, was):
            raise EffectFailed(
                f"failed: the request's {words(agent)} did not hold when {seen.who} "
                f"({target} {was.describe()}); send it again without that condition, or with "
                "one that matches"
            )
        return expect(was), (
            f"failed: {target} changed since {seen.who} (then it {was.describe()}); "
            "send the request again to act on it as it is now"
        )
    if agent:
        return agent, (
            f"failed: {target} does not meet the request's {words(agent)} "
            f"(it {now.describe()}); send the request again without it to replace the object, "
            "or write to another key"
        )
    return expect(now), f"failed: {target} changed while the broker was writing it; send again"
