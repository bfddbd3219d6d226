"""The worker pool: fair across sandboxes, and a hung job gives up its slot at its
deadline instead of holding other work back."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from broker.lifecycle.apply import Workers


@pytest.fixture
def workers() -> Iterator[Workers]:
    pool = Workers(threads=2, per_sandbox=1)
    yield pool
    pool.shutdown(wait=False)


def test_a_busy_sandbox_leaves_room_for_another(workers: Workers) -> None:
    """With one slot per sandbox, a's second job waits while b's job runs."""
    release = threading.Event()
    ran: list[str] = []
    b_done = threading.Event()
    workers.submit("a", lambda: (release.wait(10), ran.append("a1")))
    workers.submit("a", lambda: ran.append("a2"))
    workers.submit("b", lambda: (ran.append("b1"), b_done.set()))
    assert b_done.wait(5), "b waited behind a"
    assert ran == ["b1"], "a's second job ran while its first held a's only slot"
    release.set()
    workers.shutdown(wait=True)
    assert ran == ["b1", "a1", "a2"]


def test_an_overdue_job_is_abandoned_and_its_slot_freed(workers: Workers) -> None:
    """A job past its deadline is given up on; the sandbox's next job runs meanwhile."""
    hung = threading.Event()
    nxt = threading.Event()
    job = workers.submit("a", lambda: hung.wait(10), deadline_s=0.0)
    workers.submit("a", nxt.set)
    late: list[object] = []
    for _ in range(1000):  # until it has started
        late = late or workers.overdue()
        if late:
            break
        time.sleep(0.005)
    assert late == [job] and job.abandoned
    assert nxt.wait(5), "the sandbox's next job waited for the hung one"
    hung.set()


def test_jobs_without_a_deadline_are_never_abandoned(workers: Workers) -> None:
    """An apply (no deadline) is waited for however long it takes."""
    release = threading.Event()
    workers.submit("a", lambda: release.wait(10))
    assert workers.overdue() == []
    assert workers.next_deadline() == 3600.0
    release.set()


def test_shutdown_runs_what_is_queued(workers: Workers) -> None:
    """Queued jobs still run at shutdown (their outcomes are recorded before the broker stops)."""
    ran: list[int] = []
    for i in range(5):
        workers.submit("a", lambda i=i: ran.append(i))
    workers.shutdown(wait=True)
    assert ran == [0, 1, 2, 3, 4]
    with pytest.raises(RuntimeError, match="shutting down"):
        workers.submit("a", lambda: None)
