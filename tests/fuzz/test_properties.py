"""Property tests: any bytes through the real pipeline, any policy through the
classifier. Never an exception out, always an answer the agent can read."""

from __future__ import annotations

import itertools
import os
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from broker.errors import PolicyError, Rejected
from broker.intake import claims as intake
from broker.models import STATUSES
from broker.policy.ruleset import ACTIONS, parse_policy
from tests.crash.support import schema_problems
from tests.fuzz.conftest import Driver, examples
from tests.fuzz.strategies import JSON_VALUES, request_bytes

_names = itertools.count()
REVERSIBLE = {"test.record": True, "test.gated": False, "files.write": True, "mail.send": False}


def expected_id(stem: str, data: bytes) -> tuple[str, str | None]:
    """The id the broker answers under, and the strict parser's rejection code if any."""
    try:
        doc = intake.parse_json(data, 64)
    except Rejected as exc:
        return stem, exc.issues[0].code
    rid = doc.get("id") if isinstance(doc, dict) else None
    if isinstance(rid, str) and intake.REQUEST_ID.fullmatch(rid):
        return rid, None
    return stem, None


@settings(
    max_examples=examples(250, 5000),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=request_bytes())
def test_any_bytes_get_exactly_one_schema_valid_answer(driver: Driver, data: bytes) -> None:
    """Any bytes as a request: no exception, no error logged, one schema-valid result."""
    stem = f"f{next(_names)}"
    rid, code = expected_id(stem, data)
    driver.write(f"{stem}.json", data)

    driver.settle()

    result = driver.results_now().get(rid)
    assert result is not None, f"no result for {data!r}"
    assert schema_problems(result) == []
    assert result["status"] in STATUSES
    event(f"status {result['status']}" + (f" ({code})" if code else ""))
    driver.answers[result["status"]] += 1
    if code is not None:
        assert (result["status"], result["errors"][0]["code"]) == ("invalid", code)
    assert [r.getMessage() for r in driver.errors.records] == []
    assert f"{stem}.json" not in os.listdir(driver.outbox)
    assert os.listdir(driver.state / "claimed" / "default") == []


RULES = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "effect": st.sampled_from(["test.*", "test.record", "test.gated", "*", "mail.send"])
            | st.text(max_size=10)
            | st.integers(),
            "action": st.sampled_from(["auto", "approve", "deny", "allow"]) | st.integers(),
            "when": st.dictionaries(st.sampled_from(["value", "a.b", "x"]), JSON_VALUES, max_size=2)
            | st.text(max_size=3),
            "reason": st.text(max_size=10) | st.integers(),
            "approvals": st.integers(-1, 3) | st.booleans(),
            "timeout": st.sampled_from(["1h", "90s", "0s", "2y", "", "1h30m", "nan"])
            | st.floats(allow_nan=True),
            "on_timeout": st.sampled_from(["deny", "approve", "maybe"]),
            "extra": st.booleans(),
        },
    ),
    max_size=4,
)


@settings(max_examples=examples(300, 5000), deadline=None)
@given(
    rules=RULES,
    effect=st.sampled_from(sorted(REVERSIBLE)),
    params=st.dictionaries(st.sampled_from(["value", "a", "x"]), JSON_VALUES, max_size=3),
)
def test_any_policy_loads_or_names_its_fault_and_classifies_safely(
    rules: list[dict[str, Any]], effect: str, params: dict[str, Any]
) -> None:
    """A policy loads or fails naming itself; its verdicts match explain and fail closed."""
    try:
        policy = parse_policy({"rules": rules}, REVERSIBLE, "fuzz.toml")
    except PolicyError as exc:
        assert "fuzz.toml" in str(exc)
        return
    verdict = policy.classify(effect, params, REVERSIBLE[effect])
    explained, lines = policy.explain(effect, params, REVERSIBLE[effect])

    assert verdict.action in ACTIONS
    assert explained == verdict
    assert lines
    if not REVERSIBLE[effect]:
        assert verdict.on_timeout != "approve"
