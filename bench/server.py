"""The broker under test, as its own process: `broker serve` plus the bench.noop effect.

    python -m bench.server SPEC_JSON

SPEC: {"state": dir, "exports": dir, "attach": [outbox, results] | null,
       "root": sandboxes dir | null, "rescan": seconds, "cprofile": path | null,
       "ledger": postgresql URL | null, "host_id": id (with "ledger"; the password
       comes from $BENCH_PG_PASSWORD)}
Prints "ready" once it serves; SIGTERM stops it (and writes the cProfile, if asked).
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from bench.handlers import Noop
from broker.config import Config
from broker.events import Applied, FileSeen
from broker.intake.outbox import attach
from broker.loop.pipeline import Broker
from broker.policy.ruleset import Policy
from broker.registry import Registry


def build(spec: dict[str, Any]) -> Broker:
    registry = Registry()
    registry.load_entry_points()
    registry.register(Noop(), "bench")
    config = Config(
        state_dir=Path(spec["state"]),
        integrations={"files": {"root": spec["exports"]}},
        rescan_interval_s=float(spec.get("rescan", 30.0)),
        ledger_url=spec.get("ledger"),
        ledger_refs={"ledger_password_env": "BENCH_PG_PASSWORD"} if spec.get("ledger") else {},
        host_id_setting=spec.get("host_id"),
    )
    registry.check_config(config.integrations, config.base_dir)
    broker = Broker(config, registry, Policy())
    if spec.get("attach"):
        outbox, results = spec["attach"]
        broker.add(attach("default", Path(outbox), Path(results), config.state_dir))
    if spec.get("root"):
        broker.serve_root(Path(spec["root"]))
    return broker


def trace_steps(broker: Broker, path: str) -> None:
    """Log each wake-up: how many files, done-events and items it took, and how long."""
    import atexit
    import time

    rows: list[tuple[int, int, int, float]] = []
    step = broker.step

    def traced(items: Any) -> None:
        items = list(items)
        files = sum(1 for i in items if isinstance(i, FileSeen))
        done = sum(1 for i in items if isinstance(i, Applied))
        start = time.perf_counter()
        step(items)
        if items:
            rows.append((len(items), files, done, time.perf_counter() - start))

    broker.step = traced  # type: ignore[method-assign]
    atexit.register(lambda: Path(path).write_text(json.dumps(rows)))


def main() -> None:
    spec = json.loads(sys.argv[1])
    broker = build(spec)
    if spec.get("trace"):
        trace_steps(broker, spec["trace"])
    stop = threading.Event()

    def on_term(signum: int, frame: Any) -> None:
        stop.set()
        broker.wake()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)

    def ready() -> None:
        print("ready", flush=True)

    if spec.get("cprofile"):
        import cProfile

        profile = cProfile.Profile()
        profile.enable()
        try:
            broker.serve(stop, ready=ready)
        finally:
            profile.disable()
            profile.dump_stats(spec["cprofile"])
    else:
        broker.serve(stop, ready=ready)


if __name__ == "__main__":
    main()
