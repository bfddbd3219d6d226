"""Fixtures shared by the whole suite."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.testing import BrokerHarness, FakeHandler
from tests.support import SETTLE_S, Start


@pytest.fixture
def fake() -> FakeHandler:
    """A reversible, idempotent fake effect named test.record."""
    return FakeHandler("test.record")


@pytest.fixture
def exports(tmp_path: Path) -> Path:
    """An empty export root for files.write."""
    root = tmp_path / "exports"
    root.mkdir()
    return root


@pytest.fixture
def harness(tmp_path: Path, fake: FakeHandler, exports: Path) -> Iterator[BrokerHarness]:
    """A running broker in attach mode with files.write and test.record."""
    h = BrokerHarness(
        tmp_path / "h", handlers=[fake], integrations={"files": {"root": str(exports)}}
    )
    with h:
        yield h


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Start]:
    """Start a BrokerHarness (kwargs as BrokerHarness) that is stopped after the test."""
    running: list[BrokerHarness] = []

    def make(**kwargs: Any) -> BrokerHarness:
        h = BrokerHarness(tmp_path / f"broker{len(running)}", **kwargs)
        running.append(h)
        h.start()
        time.sleep(SETTLE_S)
        return h

    yield make
    for h in running:
        h.stop()
