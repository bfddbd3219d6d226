"""Fixtures shared by the whole suite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.testing import BrokerHarness, FakeHandler


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
