"""Helpers the test modules share (fixtures are in conftest.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from jsonschema import Draft202012Validator

from broker.testing import BrokerHarness
from broker.validation import load_schema

RESULT = Draft202012Validator(load_schema("result"))
SETTLE_S = 0.15  # the watchfiles fallback watches a moment after `ready`

Start = Callable[..., BrokerHarness]


def checked(result: dict[str, Any]) -> dict[str, Any]:
    """`result`, after asserting that it matches schemas/result.json."""
    problems = [e.message for e in RESULT.iter_errors(result)]
    assert not problems, f"result {result.get('id')} breaks schemas/result.json: {problems}"
    return result


def eventually(check: Callable[[], bool], timeout: float = 5.0) -> None:
    """Return once `check()` is true; fail, naming it, if it is not within `timeout`."""
    end = time.monotonic() + timeout
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"not true within {timeout}s: {check.__doc__ or check}")
        time.sleep(0.01)
