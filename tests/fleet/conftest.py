"""Fixtures of the fleet suite: a database of the session's PostgreSQL per test, the
crash suite's receiver, and hosts that are stopped after the test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.crash.support import Receiver
from tests.fleet.support import Host

MakeHost = Callable[..., Host]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A real HTTP service on 127.0.0.1 counting deliveries per request."""
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def host(tmp_path: Path, pg_url: str, receiver: Receiver) -> Iterator[MakeHost]:
    """Make a host of this test's fleet (one PostgreSQL database for all of them)."""
    made: list[Host] = []

    def make(name: str, policy: str = "", **kwargs: Any) -> Host:
        shared = made[0].pythonpath if made else ""
        h = Host(
            tmp_path / f"{name}-{len(made)}",
            name,
            kwargs.pop("url", pg_url),
            receiver.url,
            policy,
            pythonpath=shared,
            **kwargs,
        )
        made.append(h)
        return h

    yield make
    for h in made:
        h.stop()
