"""Agents that write requests faster than anyone should: a burst of thousands of files
at once, and a sandbox that never stops. A real `broker serve` process serves real
containers; its memory is read from /proc, round trips from the results dir."""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from broker.hosting import sandbox
from broker.models import TERMINAL
from tests.crash.support import BrokerProcess, Site, read_results, soak, wait_for
from tests.hostile.conftest import FIGURES, Ran

BURST = 100_000 if soak() else 20_000
FLOOD_CAP = 25

WRITE_MANY = r"""
import json, os, sys, time
count, effect, seconds = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
rate = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0  # files per second; 0: flat out
started = time.monotonic()
written = 0
for i in range(count):
    if seconds and time.monotonic() - started > seconds:
        break
    if rate and i % 50 == 0:
        time.sleep(max(0.0, started + i / rate - time.monotonic()))
    doc = {"version": 1, "id": f"r{i}", "effect": effect, "params": {"value": str(i)}}
    with open(f"/outbox/.r{i}.tmp", "w") as f:
        f.write(json.dumps(doc))
    os.rename(f"/outbox/.r{i}.tmp", f"/outbox/r{i}.json")
    written += 1
print(json.dumps({"written": written, "seconds": time.monotonic() - started}))
"""


class Served:
    """A `broker serve` process over <state>/sandboxes, with agents to run beside it."""

    def __init__(
        self, root: Path, engine: docker.DockerClient, image: str, extra: str = ""
    ) -> None:
        self.site = Site(root, "http://127.0.0.1:9/", broker_extra=extra, attach=False)
        self.engine, self.image = engine, image
        self.containers: list[Any] = []
        self.process: BrokerProcess | None = None

    def sandbox(self, name: str) -> sandbox.SandboxPaths:
        return sandbox.prepare_dirs(self.site.state, name)

    def start(self) -> BrokerProcess:
        self.process = self.site.start()
        wait_for(lambda: "serving" in self.process.output(), 30, "the broker to start")
        self.process.sample_memory()
        return self.process

    def agent(self, paths: sandbox.SandboxPaths, *args: str) -> Any:
        command = ["python3", "-c", WRITE_MANY, *args]
        container = sandbox.start(self.engine, paths, self.image, command)
        self.containers.append(container)
        return container

    def finish(self, container: Any, timeout: int = 120) -> Ran:
        status = container.wait(timeout=timeout)
        return Ran(
            status["StatusCode"],
            container.logs(stdout=True, stderr=False).decode(),
            container.logs(stdout=False, stderr=True).decode(),
        )

    def close(self) -> None:
        for container in self.containers:
            sandbox.remove(container)
        if self.process is not None:
            self.process.stop()


@pytest.fixture
def served(
    engine: docker.DockerClient,
    agent_image: str,
    tmp_path: Path,
) -> Iterator[Served]:
    """A broker process and its sandboxes, stopped and removed after the test."""
    s = Served(tmp_path, engine, agent_image, f"max_pending_per_sandbox = {FLOOD_CAP}")
    yield s
    s.close()


def result_files(results: Path) -> int:
    """How many results are in place (cheap: names only; automatic requests have no
    result file until they are terminal)."""
    return sum(1 for n in os.listdir(results) if n.endswith(".json") and n[0] != ".")


def count_terminal(results: Path) -> int:
    return sum(1 for r in read_results(results).values() if r.get("status") in TERMINAL)


def round_trip(paths: sandbox.SandboxPaths) -> float:
    """Seconds from writing one automatic request to reading its terminal result."""
    rid = f"rt-{uuid.uuid4().hex[:12]}"
    doc = {"version": 1, "id": rid, "effect": "crashtest.noop", "params": {"value": rid}}
    tmp = paths.outbox / f".{rid}.tmp"
    tmp.write_text(json.dumps(doc))
    target = paths.results / f"{rid}.json"
    started = time.monotonic()
    os.rename(tmp, paths.outbox / f"{rid}.json")
    while time.monotonic() - started < 30:
        try:
            if json.loads(target.read_bytes())["status"] in TERMINAL:
                return time.monotonic() - started
        except (FileNotFoundError, ValueError):
            pass
        time.sleep(0.002)
    return float("inf")


@pytest.mark.soak
@pytest.mark.docker
def test_burst_of_thousands_of_requests_is_answered_in_bounded_time_and_memory(
    served: Served,
) -> None:
    """A burst of thousands of requests is answered at a sustained rate with bounded memory."""
    paths = served.sandbox("burst")
    broker = served.start()
    time.sleep(0.5)
    idle_kib = broker.rss_kib()
    started = time.monotonic()
    ran = served.finish(served.agent(paths, str(BURST), "crashtest.noop", "0"))
    assert ran.code == 0, ran.stderr
    bound = 15 + BURST * 0.005

    try:
        wait_for(lambda: result_files(paths.results) >= BURST, bound, f"{BURST} results", 0.25)
    finally:
        took = time.monotonic() - started
        grew = (broker.peak_rss_kib - idle_kib) / 1024
        FIGURES["burst"] = (
            f"burst: {BURST} requests answered in {took:.1f}s "
            f"({BURST / took:.0f}/s); broker RSS {idle_kib / 1024:.0f} MiB idle, "
            f"peak +{grew:.0f} MiB"
        )

    statuses = Counter(r["status"] for r in read_results(paths.results).values())
    assert statuses == {"applied": BURST}
    assert grew < 256, f"the broker grew by {grew:.0f} MiB for {BURST} requests"
    assert not [n for n in os.listdir(paths.outbox) if n.endswith(".json")]


RATES = pytest.mark.parametrize(
    "rate, min_samples", [("1000", 5), ("0", 1)], ids=["steady-1000-per-s", "flat-out"]
)


@pytest.mark.docker
@RATES
def test_flooding_sandbox_is_capped_and_another_sandbox_is_answered_meanwhile(
    served: Served, rate: str, min_samples: int
) -> None:
    """A flooding sandbox is held to its pending cap; another sandbox's requests are each
    answered while the flood goes on (how fast: the soak variant and the benchmark)."""
    loaded, _ = flood_beside_a_calm_sandbox(served, rate)
    assert all(t != float("inf") for t in loaded), "a calm request went unanswered"
    assert len(loaded) >= min_samples


@pytest.mark.soak
@pytest.mark.docker
@RATES
def test_flooding_sandbox_is_capped_and_another_sandbox_keeps_its_latency(
    served: Served, rate: str, min_samples: int
) -> None:
    """A flooding sandbox is held to its pending cap; another's round trip stays under 1 s."""
    loaded, bound = flood_beside_a_calm_sandbox(served, rate)
    slow = [round(t, 3) for t in loaded if t > bound]
    assert slow == [], f"round trips over {bound:.3f}s while the other sandbox floods: {slow}"
    assert len(loaded) >= min_samples


def flood_beside_a_calm_sandbox(served: Served, rate: str) -> tuple[list[float], float]:
    """Flood one sandbox (at `rate` files/s, 0: flat out) while another sends one request
    at a time; assert the flood's counts; the calm round trips and their bound."""
    flood, calm = served.sandbox("flood"), served.sandbox("calm")
    served.start()
    for _ in range(3):
        round_trip(calm)  # warm
    idle = [round_trip(calm) for _ in range(10)]
    idle_median = statistics.median(idle)

    agent = served.agent(flood, "3000", "crashtest.send", "5", rate)
    wait_for(lambda: len(os.listdir(flood.outbox)) > 20, 20, "the flood to start")
    loaded: list[float] = []
    drained = threading.Event()

    def measure() -> None:
        while not drained.is_set() and len(loaded) < 60:
            loaded.append(round_trip(calm))
            time.sleep(0.05)

    meter = threading.Thread(target=measure)
    meter.start()
    try:
        ran = served.finish(agent)
        written = ran.json()["written"]
        wait_for(lambda: count_terminal(flood.results) + pending(flood) >= written, 90, "the flood")
    finally:
        drained.set()
        meter.join(60)

    results = read_results(flood.results)
    statuses = Counter(r["status"] for r in results.values())
    denied = [r for r in results.values() if r["status"] == "denied"]
    bound = max(1.0, 10 * idle_median)
    pace = "flat out" if rate == "0" else f"{rate}/s"
    FIGURES[f"flood {rate}"] = (
        f"flood ({pace}): {written} requests in {ran.json()['seconds']:.1f}s; "
        f"{statuses['pending']} pending (cap {FLOOD_CAP}), {statuses['denied']} denied; "
        "other sandbox round trip "
        f"idle median {idle_median * 1000:.0f} ms, under flood median "
        f"{statistics.median(loaded) * 1000:.0f} ms, max {max(loaded) * 1000:.0f} ms "
        f"({len(loaded)} samples)"
    )

    assert statuses == {"pending": FLOOD_CAP, "denied": written - FLOOD_CAP}, statuses
    assert all("wait for a person" in r["reason"] for r in denied)
    return loaded, bound


def pending(paths: sandbox.SandboxPaths) -> int:
    return sum(1 for r in read_results(paths.results).values() if r.get("status") == "pending")
