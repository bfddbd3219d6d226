"""Fixtures of the crash suite; it prints its figures at the end of every run that
included it (`crash points: N, lost: 0, duplicated: 0`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.crash.support import FIGURES, Receiver


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    """A real HTTP service on 127.0.0.1 counting deliveries per request."""
    r = Receiver()
    yield r
    r.close()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lines = FIGURES.lines()
    if lines:
        terminalreporter.section("crash injection")
        for line in lines:
            terminalreporter.write_line(line)
