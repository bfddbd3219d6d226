"""One function per kind of measurement; each starts its own server in fresh dirs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import procs, writer
from bench.stats import percentile

SANDBOX_UID = 10001
IMAGE = "broker-sandbox:py"
# a slow server gets fewer sequential samples, not a longer run, and its burst rate
# counts the results seen by the cap (`python -m bench --quick` halves both)
BUDGET = {"seq_s": 6.0, "burst_s": 15.0}


@dataclass
class Plan:
    """How much of everything: `--quick` shrinks it."""

    repeats: int = 3  # sequential rounds; the table shows the median of the quiet ones
    burst_repeats: int = 2
    seq_n: int = 1000
    burst_n: int = 10_000
    sandbox_repeats: int = 2
    sandbox_seq_n: int = 300
    sandbox_burst_n: int = 2000
    idle_window_s: float = 30.0  # holds exactly one of the broker's 30 s rescans
    start_repeats: int = 5
    peer_seq_n: int = 10
    peer_burst_n: int = 1000
    outbox_counts: tuple[int, ...] = (1, 100, 1000, 5000)
    burst_outboxes_max: int = 1000  # more outboxes than this: latency rows only
    idle_counts: tuple[int, ...] = (0, 100, 1000, 5000)
    fleet_sizes: tuple[int, ...] = (1, 2, 3)  # brokers sharing one PostgreSQL


QUICK = Plan(
    repeats=3,
    burst_repeats=2,
    seq_n=150,
    burst_n=1000,
    sandbox_repeats=1,
    sandbox_seq_n=100,
    sandbox_burst_n=300,
    idle_window_s=10.0,
    start_repeats=4,  # a start round is seconds: enough of them to find two quiet
    peer_seq_n=4,
    peer_burst_n=300,
    outbox_counts=(1, 100, 1000),
    idle_counts=(0, 100, 1000),
    fleet_sizes=(1, 2),
)


@dataclass
class Cells:
    """A fresh directory per measured cell, under one base dir per run."""

    base: Path
    count: int = 0
    made: list[Path] = field(default_factory=list)

    def new(self, label: str) -> Path:
        self.count += 1
        cell = self.base / f"{self.count:03d}-{label}"
        cell.mkdir(parents=True)
        self.made.append(cell)
        return cell


def _doc(effect: str) -> writer.Doc:
    return writer._effect_doc(effect)


def _seq_figures(latencies: list[float]) -> dict[str, float]:
    return {
        "p50_ms": percentile(latencies, 50) * 1e3,
        "p99_ms": percentile(latencies, 99) * 1e3,
        "n": len(latencies),
    }


def _exercise(
    live: Live, seq_n: int, burst_n: int, warm: int, tag: str, staging: Path
) -> dict[str, Any]:
    """`tag` makes this exercise's request ids its own (a server is measured again)."""
    boxes, server, doc = live.boxes, live, _doc(live.effect)
    out: dict[str, Any] = {}
    if warm:
        writer.sequential(boxes, warm, doc, f"{tag}w")
    cpu = server.cpu_seconds
    if seq_n:
        before = cpu()
        latencies = writer.sequential(boxes, seq_n, doc, f"{tag}s", budget=BUDGET["seq_s"])
        out.update(_seq_figures(latencies))
        out["seq_cpu_us"] = (cpu() - before) / len(latencies) * 1e6
    if burst_n:
        before = cpu()
        out["burst"] = writer.burst(
            boxes, burst_n, doc, f"{tag}b", str(staging), timeout=BUDGET["burst_s"]
        )
        out["rate"] = out["burst"]["rate"]
        # CPU the server spent per answered request (a capped run counts what it answered)
        out["burst_cpu_us"] = (cpu() - before) / max(1, out["burst"]["done"]) * 1e6
    out.update(server.memory())
    return out


class Live:
    """Servers up in their cell, measured again and again: the sequential rounds of a
    run interleave over the same servers (each warmed up once)."""

    def __init__(
        self,
        boxes: list[tuple[str, str]],
        effect: str,
        cell: Path,
        servers: list[procs.Server],
        warm: int = 30,
        bursts: bool = True,
    ) -> None:
        self.boxes, self.effect, self.cell = boxes, effect, cell
        self.bursts = bursts  # whether the plan measures bursts on it too
        self.servers = servers
        self.warm = warm
        self.times = 0

    def cpu_seconds(self) -> float:
        """CPU of every server, summed."""
        return sum(s.cpu_seconds() for s in self.servers)

    def memory(self) -> dict[str, float]:
        """VmRSS and VmHWM of the largest server."""
        found = [s.memory() for s in self.servers]
        return {k: max(m.get(k, 0.0) for m in found) for k in ("VmRSS", "VmHWM")}

    def exercise(self, seq_n: int, burst_n: int) -> dict[str, Any]:
        self.times += 1  # each time its own request ids and staging dir
        tag = f"t{self.times}"
        out = _exercise(self, seq_n, burst_n, self.warm, tag, self.cell / f"staging-{tag}")
        self.warm = 0
        return out

    def close(self) -> None:
        for server in self.servers:
            server.stop()

    def __enter__(self) -> Live:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_raw(cells: Cells, *, fsync: bool = False, floor: str = "") -> Live:
    """The raw loop; `floor` = "journal" adds the ledger's least durability (one
    fdatasync'ed append per request), "files.write" that plus the effect's own work."""
    cell = cells.new(f"raw-{floor}" if floor else "raw-fsync" if fsync else "raw")
    outbox, results = cell / "outbox", cell / "results"
    outbox.mkdir()
    results.mkdir()
    journal = cell / "journal" if floor else None
    write = cell / "exports" if floor == "files.write" else None
    if write is not None:
        write.mkdir()
    effect = "files.write" if floor == "files.write" else "bench.noop"
    log = cell / "server.log"
    server = procs.raw(outbox, results, log, fsync=fsync, journal=journal, write=write)
    return Live([(str(outbox), str(results))], effect, cell, [server])


def raw(
    cells: Cells, seq_n: int, burst_n: int, *, fsync: bool = False, floor: str = ""
) -> dict[str, Any]:
    with start_raw(cells, fsync=fsync, floor=floor) as live:
        return live.exercise(seq_n, burst_n)


def start_native(cells: Cells) -> Live:
    """The native accept-path prototype (bench/native): one outbox, its own state dir."""
    cell = cells.new("native")
    outbox, results, state = cell / "outbox", cell / "results", cell / "state"
    for folder in (outbox, results, state):
        folder.mkdir()
    server = procs.native(outbox, results, state, cell / "server.log")
    return Live([(str(outbox), str(results))], "bench.noop", cell, [server])


def _layout(cell: Path, boxes: int) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """The broker's dirs: attach mode for one outbox, root mode for several."""
    cell.mkdir(parents=True, exist_ok=True)
    state, exports = cell / "state", cell / "exports"
    state.mkdir()
    exports.mkdir()
    spec: dict[str, Any] = {"state": str(state), "exports": str(exports)}
    if boxes == 1:
        outbox, results = cell / "outbox", cell / "results"
        outbox.mkdir()
        results.mkdir()
        spec["attach"] = [str(outbox), str(results)]
        return spec, [(str(outbox), str(results))]
    root = state / "sandboxes"
    pairs = []
    for i in range(boxes):
        base = root / f"sb-{i:04d}"
        (base / "outbox").mkdir(parents=True)
        (base / "results").mkdir()
        pairs.append((str(base / "outbox"), str(base / "results")))
    spec["root"] = str(root)
    return spec, pairs


def start_broker(
    cells: Cells, effect: str, boxes: int, cprofile: Path | None = None, *, bursts: bool = True
) -> Live:
    cell = cells.new(f"broker-{effect}-{boxes}")
    spec, pairs = _layout(cell, boxes)
    if cprofile is not None:
        spec["cprofile"] = str(cprofile)
    server = procs.broker(spec, cell / "server.log", timeout=60.0 + boxes / 50)
    return Live(pairs, effect, cell, [server], bursts=bursts)


def broker(
    cells: Cells,
    effect: str,
    boxes: int,
    seq_n: int,
    burst_n: int,
    *,
    around: Callable[[procs.Server, Callable[[], dict[str, Any]]], dict[str, Any]] | None = None,
    cprofile: Path | None = None,
) -> dict[str, Any]:
    with start_broker(cells, effect, boxes, cprofile) as live:
        if around is None:
            return live.exercise(seq_n, burst_n)
        return around(live.servers[0], lambda: live.exercise(seq_n, burst_n))


def start_fleet(cells: Cells, brokers: int, new_database: Callable[[], str]) -> Live:
    """`brokers` brokers (hosts b0, b1, …) sharing one new PostgreSQL database, each with
    one attach-mode outbox; the writer spreads requests over them round-robin."""
    cell = cells.new(f"fleet-{brokers}")
    url = new_database()
    servers: list[procs.Server] = []
    pairs: list[tuple[str, str]] = []
    try:
        for n in range(brokers):
            spec, boxes = _layout(cell / f"b{n}", 1)
            spec.update(ledger=url, host_id=f"b{n}")
            servers.append(procs.broker(spec, cell / f"b{n}" / "server.log"))
            pairs.extend(boxes)
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return Live(pairs, "bench.noop", cell, servers)


def fleet(
    cells: Cells, brokers: int, seq_n: int, burst_n: int, new_database: Callable[[], str]
) -> dict[str, Any]:
    with start_fleet(cells, brokers, new_database) as live:
        return live.exercise(seq_n, burst_n)


def start_peer(cells: Cells, kind: str) -> Live:
    cell = cells.new(kind)
    outbox, results = cell / "outbox", cell / "results"
    outbox.mkdir()
    results.mkdir()
    server = procs.peer(kind, outbox, results, cell / "server.log")
    return Live([(str(outbox), str(results))], "bench.noop", cell, [server], warm=2)


def peer(cells: Cells, kind: str, seq_n: int, burst_n: int) -> dict[str, Any]:
    with start_peer(cells, kind) as live:
        return live.exercise(seq_n, burst_n)


def idle(cells: Cells, counts: tuple[int, ...], window: float) -> dict[int, dict[str, float]]:
    """CPU seconds per minute and RSS of brokers serving idle outboxes, side by side."""
    servers: dict[int, procs.Server] = {}
    try:
        for count in counts:
            cell = cells.new(f"idle-{count}")
            spec, _ = _layout(cell, max(count, 2))
            if count == 0:
                shutil.rmtree(Path(spec["root"]))
                Path(spec["root"]).mkdir()
            servers[count] = procs.broker(spec, cell / "server.log")
        time.sleep(2.0)  # start-up work done
        before = {c: s.cpu_seconds() for c, s in servers.items()}
        time.sleep(window)
        out = {}
        for count, server in servers.items():
            used = server.cpu_seconds() - before[count]
            out[count] = {
                # rounded: CPU time comes in clock ticks, and 5 ticks in 30 s is
                # 0.1/min, not 0.09999999999999996
                "cpu_s_per_min": round(used * 60.0 / window, 6),
                "window_s": window,
                **server.memory(),
            }
        return out
    finally:
        for server in servers.values():
            server.stop()


# -- Docker -----------------------------------------------------------------------


def docker_ready() -> str | None:
    """None when the engine answers and the agent image exists, else why not."""
    try:
        subprocess.run(["docker", "info"], capture_output=True, check=True, timeout=20)
        subprocess.run(
            ["docker", "image", "inspect", IMAGE], capture_output=True, check=True, timeout=20
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"docker or the image {IMAGE} is not available ({exc}); run `make image`"
    return None


def _workspace(cell: Path) -> Path:
    ws = cell / "workspace"
    ws.mkdir()
    shutil.copy(Path(writer.__file__), ws / "writer.py")
    os.chown(ws, SANDBOX_UID, SANDBOX_UID)
    return ws


def sandbox_raw(cells: Cells, seq_n: int, burst_n: int) -> dict[str, Any]:
    """The raw watcher on the host, the writer in a bare container through bind mounts."""
    cell = cells.new("sandbox-raw")
    outbox, results = cell / "outbox", cell / "results"
    outbox.mkdir()
    results.mkdir()
    os.chown(outbox, SANDBOX_UID, SANDBOX_UID)
    ws = _workspace(cell)
    with procs.raw(outbox, results, cell / "server.log"):
        subprocess.run(
            [
                "docker", "run", "--rm", "--network", "none",
                "--user", f"{SANDBOX_UID}:{SANDBOX_UID}",
                "-v", f"{outbox}:/outbox", "-v", f"{results}:/results:ro",
                "-v", f"{ws}:/workspace", IMAGE,
                "python3", "/workspace/writer.py", "/outbox", "/results",
                str(seq_n), str(burst_n), "bench.noop", "/workspace/out.json",
            ],
            check=True, capture_output=True, timeout=600,
        )  # fmt: skip
    return _container_report(ws)


def sandbox_broker(cells: Cells, effect: str, seq_n: int, burst_n: int) -> dict[str, Any]:
    """`broker run` (broker.hosting.runner.run, with bench.noop registered) serving a container."""
    cell = cells.new(f"sandbox-{effect}")
    ws = _workspace(cell)
    (cell / "state").mkdir()
    (cell / "exports").mkdir()
    spec = {"state": str(cell / "state"), "exports": str(cell / "exports"), "workspace": str(ws)}
    command = [
        "python3", "/workspace/writer.py", "/outbox", "/results",
        str(seq_n), str(burst_n), effect, "/workspace/out.json",
    ]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "bench.sandbox_run", json.dumps(spec), *command],
        cwd=procs.ROOT,
        env={**os.environ, "PYTHONPATH": str(procs.ROOT)},
        capture_output=True,
        timeout=600,
    )
    (cell / "run.log").write_bytes(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"broker run failed ({done.returncode}); see {cell / 'run.log'}")
    return _container_report(ws)


def _container_report(ws: Path) -> dict[str, Any]:
    report = json.loads((ws / "out.json").read_text())
    out: dict[str, Any] = _seq_figures(report["sequential"])
    if "burst" in report:
        out["burst"] = report["burst"]
        out["rate"] = report["burst"]["rate"]
    return out


class Starts:
    """`broker run -- true` end to end against a bare `docker run --rm`: cold (nothing
    serves the state dir; inputs whose check passed before, as every run of a config
    after its first; and the first, whose inputs are checked before the start: its
    record removed first), beside a `broker serve` (which runs it for the run:
    broker.hosting.run_service) and from that serve's warm pool; one of each per `once`,
    each begun with the pool full so that no refill shares the engine with a cell."""

    def __init__(self, cells: Cells) -> None:
        cell = cells.new("start")
        self.cell = cell
        self.bare = ["docker", "run", "--rm", "--network", "none", IMAGE, "true"]
        self.configs = {
            "broker_s": _start_config(cell / "cold"),
            "thin_s": _start_config(cell / "served"),
            "pool_s": _start_config(cell / "pooled", "[sandbox]\nwarm = 2\n"),
        }
        self.serves: list[subprocess.Popen[bytes]] = []

    def argv(self, key: str) -> list[str]:
        if key == "docker_s":
            return self.bare
        broker_cli = str(Path(sys.executable).parent / "broker")
        config = self.configs["broker_s" if key == "first_s" else key]
        return [broker_cli, "run", "--config", str(config), "--", "true"]

    def __enter__(self) -> Starts:
        for key in ("thin_s", "pool_s"):
            config = self.configs[key]
            with (config.parent / "serve.log").open("wb") as log:
                self.serves.append(
                    subprocess.Popen(
                        [self.argv(key)[0], "serve", "--config", str(config)],
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=log,
                    )
                )
        for key in ("docker_s", "broker_s", "thin_s", "pool_s"):  # warm every cache
            self._ready()
            subprocess.run(self.argv(key), check=True, capture_output=True)
        return self

    def __exit__(self, *exc: object) -> None:
        for serve in self.serves:
            serve.send_signal(signal.SIGINT)
        for serve in self.serves:
            try:
                serve.wait(60)
            except subprocess.TimeoutExpired:
                serve.kill()

    def _ready(self, timeout: float = 60.0) -> None:
        """Both serves listening, and the pool holding its two."""
        end = time.monotonic() + timeout
        served = self.configs["thin_s"].parent / "state" / "control" / "broker.sock"
        pool = self.configs["pool_s"].parent / "state" / "warm"
        while not (served.exists() and len(list(pool.glob("k*/sb-*"))) >= 2):
            if time.monotonic() > end or any(s.poll() is not None for s in self.serves):
                raise RuntimeError(f"broker serve not ready; see {self.cell}/*/serve.log")
            time.sleep(0.05)

    def once(self, reverse: bool = False) -> dict[str, float]:
        """One of each start, in the order given. An untimed `docker run` comes first:
        the cell right after the round's probe (its creates and fsyncs) was the slowest
        of its kind in most start sections measured on 2026-12-06 (`docker run` in even
        rounds, the pooled start in odd ones, by 15–40 ms), and each round's ratios are
        judged alone."""
        out: dict[str, float] = {}
        keys = ["docker_s", "broker_s", "first_s", "thin_s", "pool_s"]
        self._ready()
        subprocess.run(self.bare, check=True, capture_output=True, stdin=subprocess.DEVNULL)
        for key in keys[:: -1 if reverse else 1]:
            self._ready()
            if key == "first_s":  # as if these inputs were new (broker.cli.passed)
                (self.configs["broker_s"].parent / "state" / "checked.json").unlink()
            out[key] = _timed(self.argv(key))
        return out


def _start_config(base: Path, extra: str = "") -> Path:
    base.mkdir()
    config = base / "broker.toml"
    config.write_text(f'[broker]\nstate_dir = "{base / "state"}"\n{extra}')
    return config


def _timed(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, stdin=subprocess.DEVNULL)
    return time.perf_counter() - start
