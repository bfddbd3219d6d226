"""The warm pool's cost and what it buys: `python -m bench.warm [--size 4] [--window 20]`.

Idle cost: a pool of N proven, started launchers (each blocked on its FIFO), measured
over a window: the CPU-seconds per minute of the containers (their cgroups) and of the
engine (dockerd, containerd and the shims, from /proc), and each container's memory
(its cgroup's usage). Latency: a take + launch + wait + remove of `true` from the pool,
against a cold `docker run --rm --network none IMAGE true`, interleaved. The take runs
in this process, so a `broker run` from the pool adds its own start-up to it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.cases import IMAGE
from bench.fsprobe import engine_cpu_s


def _cgroup_file(container_id: str, v1: tuple[str, str], v2: str) -> Path | None:
    """The container's cgroup file: v1 cgroupfs, v2 cgroupfs, or v2 systemd."""
    candidates = [
        Path("/sys/fs/cgroup") / v1[0] / "docker" / container_id / v1[1],
        Path("/sys/fs/cgroup/docker") / container_id / v2,
        Path("/sys/fs/cgroup/system.slice") / f"docker-{container_id}.scope" / v2,
    ]
    return next((p for p in candidates if p.exists()), None)


def container_cpu_s(container_id: str) -> float:
    found = _cgroup_file(container_id, ("cpuacct", "cpuacct.usage"), "cpu.stat")
    if found is None:
        return float("nan")
    text = found.read_text()
    if found.name == "cpu.stat":
        usec = dict(line.split() for line in text.splitlines())["usage_usec"]
        return int(usec) / 1e6
    return int(text) / 1e9


def container_memory(container_id: str) -> int:
    found = _cgroup_file(container_id, ("memory", "memory.usage_in_bytes"), "memory.current")
    return int(found.read_text()) if found is not None else -1


def idle_cost(pool: Any, window_s: float) -> dict[str, Any]:
    """CPU-s per minute and memory of a filled pool left alone for ``window_s``."""
    ids = [json.loads(p.read_text())["container_id"] for p in pool.idle()]
    before = [container_cpu_s(i) for i in ids]
    engine_before, start = engine_cpu_s(), time.monotonic()
    time.sleep(window_s)
    elapsed = time.monotonic() - start
    per_min = 60.0 / elapsed
    containers = sum(container_cpu_s(i) - b for i, b in zip(ids, before, strict=True))
    return {
        "size": len(ids),
        "window_s": round(elapsed, 2),
        "containers_cpu_s_per_min": containers * per_min,
        "engine_cpu_s_per_min": (engine_cpu_s() - engine_before) * per_min,
        "memory_bytes": [container_memory(i) for i in ids],
    }


def latencies(pool: Any, repeats: int) -> dict[str, Any]:
    """From the pool (take, launch, wait, remove) against a cold docker run, interleaved;
    the pool is full again before each take."""
    from broker.hosting import warm

    bare = ["docker", "run", "--rm", "--network", "none", IMAGE, "true"]
    pooled, cold = [], []
    for _ in range(repeats):
        assert pool.wait_full(120), "the pool did not refill"
        start = time.perf_counter()
        taken = pool.take()
        assert taken is not None
        handle = warm.launch(taken, ["true"], pool.runtime)
        handle.wait(timeout=60)
        pool.runtime.remove(handle)
        pooled.append(time.perf_counter() - start)
        assert pool.wait_full(120), "the pool did not refill"
        start = time.perf_counter()
        subprocess.run(bare, check=True, capture_output=True)
        cold.append(time.perf_counter() - start)
    p50, c50 = statistics.median(pooled), statistics.median(cold)
    return {
        "warm_s": pooled,
        "docker_s": cold,
        "warm_p50_s": p50,
        "docker_p50_s": c50,
        "ratio": p50 / c50,
    }


def measure(base: Path, size: int = 4, window_s: float = 20.0, repeats: int = 5) -> dict[str, Any]:
    """The `warm` section: a pool of ``size`` on a fresh state dir under ``base``."""
    from broker.config import Config
    from broker.hosting import warm
    from broker.hosting.runtimes.docker import DockerRuntime
    from broker.hosting.warm_keeper import WarmPool

    config = Config(state_dir=base / "state", sandbox={"image": IMAGE})
    runtime = DockerRuntime()
    pool = WarmPool(
        runtime, config.state_dir, warm.settings(config, "docker"), size, own_runtime=True
    )
    try:
        pool.start()
        start = time.perf_counter()
        assert pool.wait_full(300), "the pool did not fill"
        filled = time.perf_counter() - start
        return {"fill_s": filled, **idle_cost(pool, window_s), **latencies(pool, repeats)}
    finally:
        pool.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.warm")
    parser.add_argument("--size", type=int, default=4)
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-warm-") as base:
        found = measure(Path(base), args.size, args.window, args.repeats)
    json.dump(found, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def lines_into(run: Any, lines: list[str], rows: list[dict[str, Any]]) -> None:
    """The `warm` section's lines of the bench's table (bench.report), one per sample."""
    for sample in run.samples.get("warm", []):
        tag = "" if run.quiet().get(sample["round"]) else " (noisy round)"
        memory = [m for m in sample["memory_bytes"] if m >= 0]
        mib = statistics.median(memory) / 2**20 if memory else float("nan")
        lines.append(f"5b. warm pool of {sample['size']}{tag}")
        lines.append(
            f"  {'idle CPU-s/min, containers + engine':<44} "
            f"{sample['containers_cpu_s_per_min']:.3f} + {sample['engine_cpu_s_per_min']:.3f}"
            f"   memory {mib:.2f} MiB per container"
        )
        lines.append(
            f"  {'take+launch+wait+remove true, p50':<44} {sample['warm_p50_s']:.3f} s vs "
            f"docker run {sample['docker_p50_s']:.3f} s   {sample['ratio']:.2f}×"
        )
        rows.append({"section": "5b. warm", **sample})
