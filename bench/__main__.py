"""python -m bench [--quick] [--profile] [--skip SECTION ...] [--dir DIR] [--keep]

Prints one table (each figure the median over repeated runs, min–max in brackets,
and each broker figure as a ratio to the raw baseline measured in the same run) and
writes it, with every run's numbers and the file-system probes, to
bench/results/<date>.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import cases, fsprobe
from bench import credentials as credential_rows  # section 8, its own module
from bench.stats import Figure, ratio

RESULTS = Path(__file__).resolve().parent / "results"
SECTIONS = (
    *("baseline", "broker", "many", "fleet", "sandbox", "idle", "start", "peers", "agents"),
    "credentials",
)


class Run:
    """Everything measured in one invocation, by row label."""

    def __init__(self) -> None:
        self.samples: dict[str, list[dict[str, Any]]] = {}
        self.probes: list[dict[str, Any]] = []
        self.notes: list[str] = []

    def add(self, label: str, sample: dict[str, Any]) -> None:
        self.samples.setdefault(label, []).append(sample)

    def figure(self, label: str, key: str) -> Figure:
        return Figure(tuple(s[key] for s in self.samples.get(label, []) if key in s))


def _probe(run: Run, cells: cases.Cells, when: str) -> None:
    found = fsprobe.probe(cells.base / "probes")
    run.probes.append({"when": when, **found})


def measure(args: argparse.Namespace, cells: cases.Cells, run: Run) -> None:
    """Sequential cells first, then bursts: a broker's burst removes thousands of files,
    which slows this file system down for minutes (see fsprobe); every cell records a
    probe taken just before it."""
    plan = cases.QUICK if args.quick else cases.Plan()
    if args.quick:
        cases.BUDGET.update(seq_s=3.0, burst_s=8.0)
    want = set(SECTIONS) - set(args.skip)
    _probe(run, cells, "start")
    pg = _postgres(run) if "fleet" in want else None
    if pg is None:
        want.discard("fleet")

    def cell(label: str, measure: Callable[..., dict[str, Any]], *args: Any, **kw: Any) -> None:
        probe = fsprobe.probe(cells.base / "probes")
        run.add(label, {**measure(cells, *args, **kw), "probe": probe})

    def server_cells(seq: int, burst: int, many_seq: int) -> None:
        if "baseline" in want or "broker" in want:
            cell("raw", cases.raw, seq, burst)
            cell("raw+fsync", cases.raw, seq, burst, fsync=True)
            cell("floor", cases.raw, seq, burst, floor="journal")
            cell("floor files.write", cases.raw, seq, burst, floor="files.write")
        if "broker" in want:
            for effect in ("bench.noop", "files.write"):
                cell(f"broker {effect}", cases.broker, effect, 1, seq, burst)
        if "fleet" in want and pg is not None:
            for brokers in (1, 2):
                cell(f"fleet ×{brokers}", cases.fleet, brokers, seq, burst, pg.new_database)
        if "many" in want:
            for count in plan.outbox_counts[1:]:
                cell(
                    f"broker bench.noop ×{count}",
                    cases.broker,
                    "bench.noop",
                    count,
                    many_seq,
                    burst,
                )

    try:
        for r in range(plan.repeats):
            server_cells(plan.seq_n, 0, plan.many_seq_n)
            print(f"bench: sequential {r + 1}/{plan.repeats} done", file=sys.stderr, flush=True)
        for r in range(plan.burst_repeats):
            server_cells(0, plan.burst_n, 0)
            print(f"bench: burst {r + 1}/{plan.burst_repeats} done", file=sys.stderr, flush=True)
    finally:
        if pg is not None:
            pg.close()

    if "sandbox" in want or "start" in want:
        why = cases.docker_ready()
        if why:
            run.notes.append(f"sandbox and start sections skipped: {why}")
            want -= {"sandbox", "start"}
    if "sandbox" in want:
        n, b = plan.sandbox_seq_n, plan.sandbox_burst_n
        for _ in range(plan.sandbox_repeats):
            cell("sandbox raw", cases.sandbox_raw, n, b)
            for effect in ("bench.noop", "files.write"):
                cell(f"sandbox {effect}", cases.sandbox_broker, effect, n, b)
        print("bench: sandbox done", file=sys.stderr, flush=True)
    if "idle" in want:
        for count, found in cases.idle(cells, plan.idle_counts, plan.idle_window_s).items():
            run.add(f"idle ×{count}", found)
        print("bench: idle done", file=sys.stderr, flush=True)
    if "start" in want:
        times = cases.start_times(cells, plan.start_repeats)
        for docker_s, broker_s, thin_s in zip(
            times["docker"], times["broker"], times["thin"], strict=True
        ):
            run.add("start", {"docker_s": docker_s, "broker_s": broker_s, "thin_s": thin_s})
    if "peers" in want:
        for kind in ("poll", "watchfiles"):
            cell(kind, cases.peer, kind, plan.peer_seq_n, plan.peer_burst_n)
    if "agents" in want:
        from bench import agents

        blocks, calls = (10, 50) if args.quick else (50, 300)
        run.add("mcp", {"call_s": agents.mcp_calls(cells.base, calls)})
        if not cases.docker_ready():
            run.add("executors", agents.executors(blocks))
        print("bench: agents done", file=sys.stderr, flush=True)
    if "credentials" in want:
        credential_rows.measure_into(run, cells.base, args.quick)
    _probe(run, cells, "end")


class _Postgres:
    """The bench's own PostgreSQL (durable: fsync on), one new database per cell."""

    def __init__(self) -> None:
        from tests.pgserver import PASSWORD, PgServer

        self.server = PgServer(fsync=True)
        self.server.start()
        os.environ["BENCH_PG_PASSWORD"] = PASSWORD  # the brokers' password reference
        self._made = 0

    def new_database(self) -> str:
        self._made += 1
        return self.server.create_database(f"bench{self._made}")

    def close(self) -> None:
        self.server.destroy()


def _postgres(run: Run) -> _Postgres | None:
    try:
        return _Postgres()
    except Exception as exc:  # no binaries, no psycopg: the rest of the bench still runs
        run.notes.append(f"fleet section skipped: {exc}")
        return None


# -- the table ------------------------------------------------------------------

LATENCY_ROWS = [
    ("1. baseline", "raw", "raw inotify round trip", "raw"),
    ("1. baseline", "raw+fsync", "raw + fsync of each result (reference)", "raw"),
    ("1. baseline", "floor", "(a) durable floor: raw + fdatasync'ed journal", "raw"),
    ("1. baseline", "floor files.write", "(b) durable floor + files.write's work", "raw"),
    ("2. broker", "broker bench.noop", "broker, bench.noop, 1 outbox (attach)", "floor"),
    (
        "2. broker",
        "broker files.write",
        "broker, files.write, 1 outbox (attach)",
        "floor files.write",
    ),
    ("2. broker", "broker bench.noop ×100", "broker, bench.noop, 100 outboxes (root)", "floor"),
    ("2. broker", "broker bench.noop ×1000", "broker, bench.noop, 1,000 outboxes (root)", "floor"),
    (
        "2b. PostgreSQL (ratios to the SQLite row above)",
        "fleet ×1",
        "broker, bench.noop, PostgreSQL ledger",
        "broker bench.noop",
    ),
    (
        "2b. PostgreSQL (ratios to the SQLite row above)",
        "fleet ×2",
        "two brokers sharing PostgreSQL (both)",
        "broker bench.noop",
    ),
    ("3. sandbox", "sandbox raw", "raw watcher, writer in a container", "sandbox raw"),
    (
        "3. sandbox",
        "sandbox bench.noop",
        "broker run, bench.noop, writer in container",
        "sandbox raw",
    ),
    (
        "3. sandbox",
        "sandbox files.write",
        "broker run, files.write, writer in container",
        "sandbox raw",
    ),
    ("6. peers", "poll", "polling loop, scan every 1 s", "raw"),
    ("6. peers", "watchfiles", "watchfiles, default settings", "raw"),
]


def _ratio(value: Figure, base: Figure) -> str:
    r = ratio(value, base)
    return "" if r != r else f"{r:.2f}×"


def _probes(run: Run, key: str) -> str:
    found = [s["probe"] for s in run.samples.get(key, []) if "probe" in s]
    if not found:
        return ""
    create = Figure(tuple(p["create_p50_us"] for p in found)).median
    sync = Figure(tuple(p["fsync_p50_us"] for p in found)).median
    return f"{create:.0f}/{sync:.0f}"


def table(run: Run) -> tuple[str, list[dict[str, Any]]]:
    lines = []
    rows: list[dict[str, Any]] = []
    head = (
        f"{'':<46} {'p50 ms':>20} {'p99 ms':>21} {'burst req/s':>22}"
        f" {'p50':>7} {'p99':>7} {'rate':>7}  {'fs probe':>9}"
    )
    lines.append(head)
    lines.append(
        f"{'':<46} {'(median, min–max over runs)':>64} {'ratio to its baseline':>23}"
        f"  {'create/fsync µs':>15}"
    )
    section = ""
    for sec, key, text, base_key in LATENCY_ROWS:
        if key not in run.samples:
            continue
        if sec != section:
            lines.append(sec)
            section = sec
        p50, p99, rate = (run.figure(key, k) for k in ("p50_ms", "p99_ms", "rate"))
        b50, b99, brate = (run.figure(base_key, k) for k in ("p50_ms", "p99_ms", "rate"))
        own = key == base_key
        lines.append(
            f"  {text:<44} {p50.show(1, 3):>20} {p99.show(1, 3):>21} {rate.show(1, 0):>22}"
            f" {'' if own else _ratio(p50, b50):>7} {'' if own else _ratio(p99, b99):>7}"
            f" {'' if own else _ratio(rate, brate):>7}  {_probes(run, key):>15}"
        )
        hwm = run.figure(key, "VmHWM")
        rows.append(
            {
                "section": sec,
                "row": text,
                "key": key,
                "baseline": base_key,
                "p50_ms": p50.to_json(),
                "p99_ms": p99.to_json(),
                "rate": rate.to_json(),
                "peak_rss_mib": hwm.to_json(),
                "ratio": {
                    "p50": ratio(p50, b50),
                    "p99": ratio(p99, b99),
                    "rate": ratio(rate, brate),
                },
            }
        )
    mem = [
        (text, run.figure(key, "VmHWM"))
        for _, key, text, _ in LATENCY_ROWS
        if key.startswith("broker") and key in run.samples
    ]
    if mem:
        lines.append(
            "   peak RSS of the broker after its burst (MiB): "
            + "; ".join(f"{t.split(', ', 1)[-1]} {f.show(1, 0)}" for t, f in mem)
        )
    cpu_rows = [
        (text, run.figure(key, "burst_cpu_us"))
        for _, key, text, _ in LATENCY_ROWS
        if key in run.samples and run.figure(key, "burst_cpu_us").runs
    ]
    if cpu_rows:
        lines.append(
            "   server CPU per request in the burst (µs): "
            + "; ".join(f"{t} {f.show(1, 0)}" for t, f in cpu_rows)
        )
    idle = [k for k in run.samples if k.startswith("idle")]
    if idle:
        lines.append("4. idle (broker process, root mode)")
        for key in idle:
            cpu, rss = run.figure(key, "cpu_s_per_min"), run.figure(key, "VmRSS")
            window = run.samples[key][0]["window_s"]
            text = f"{key.split('×')[1]} idle outboxes"
            lines.append(
                f"  {text:<44} CPU {cpu.show(1, 3)} s/min (over {window:.0f} s), "
                f"RSS {rss.show(1, 1)} MiB"
            )
            rows.append(
                {
                    "section": "4. idle",
                    "row": text,
                    "cpu_s_per_min": cpu.to_json(),
                    "rss_mib": rss.to_json(),
                    "window_s": window,
                }
            )
    if "start" in run.samples:
        docker, ours = run.figure("start", "docker_s"), run.figure("start", "broker_s")
        thin = run.figure("start", "thin_s")
        lines.append("5. sandbox start")
        lines.append(f"  {'docker run --rm --network none IMAGE true':<44} {docker.show(1, 3)} s")
        lines.append(f"  {'broker run -- true':<44} {ours.show(1, 3)} s   {_ratio(ours, docker)}")
        lines.append(
            f"  {'broker run -- true, a broker serving':<44} {thin.show(1, 3)} s   "
            f"{_ratio(thin, docker)}"
        )
        rows.append(
            {
                "section": "5. start",
                "docker_s": docker.to_json(),
                "broker_s": ours.to_json(),
                "thin_s": thin.to_json(),
                "ratio": ratio(ours, docker),
                "thin_ratio": ratio(thin, docker),
            }
        )
    _agent_rows(run, lines, rows)
    credential_rows.lines_into(run, lines, rows)
    lines.append(
        "file-system probe (µs per small-file create p50/p99, per fsync p50; load average): "
        + "; ".join(
            f"{p['when']} {p['create_p50_us']:.0f}/{p['create_p99_us']:.0f}, "
            f"{p['fsync_p50_us']:.0f}; load {p['loadavg_1m']:.1f}"
            for p in run.probes
        )
    )
    return "\n".join(lines), rows


def _agent_rows(run: Run, lines: list[str], rows: list[dict[str, Any]]) -> None:
    """7. agents: the executors side by side (per block, start-up) and MCP tools/call."""
    if "executors" in run.samples or "mcp" in run.samples:
        lines.append("7. agents (ms; ratio to AutoGen's DockerCommandLineCodeExecutor)")
    for sample in run.samples.get("executors", []):
        ours, theirs = (
            Figure(tuple(sample["ours_block_s"])),
            Figure(tuple(sample["autogen_block_s"])),
        )
        per_block = ours.median / theirs.median
        ours_start = Figure(tuple(sample["ours_start_s"])).median
        theirs_start = Figure(tuple(sample["autogen_start_s"])).median
        start = ours_start / theirs_start
        lines.append(
            f"  {'python block, SandboxCodeExecutor (auto)':<44} p50 {ours.median * 1e3:.1f}"
            f" vs {theirs.median * 1e3:.1f}  {per_block:.2f}×"
        )
        lines.append(
            f"  {'start-up, SandboxCodeExecutor (warm, median)':<44} {ours_start * 1e3:.0f}"
            f" vs {theirs_start * 1e3:.0f}  {start:.2f}×"
        )
        rows.append(
            {
                "section": "7. agents",
                "block_ratio": per_block,
                "start_ratio": start,
                "ours_block_p50_s": ours.median,
                "autogen_block_p50_s": theirs.median,
                "ours_start_s": ours_start,
                "autogen_start_s": theirs_start,
            }
        )
    for sample in run.samples.get("mcp", []):
        calls = sorted(sample["call_s"])
        p50, p99 = calls[len(calls) // 2], calls[min(len(calls) - 1, int(len(calls) * 0.99))]
        lines.append(
            f"  {'MCP tools/call bench.noop (outbox mcp)':<44} p50 {p50 * 1e3:.1f},"
            f" p99 {p99 * 1e3:.1f}"
        )
        rows.append({"section": "7. agents", "row": "mcp tools/call", "p50_s": p50, "p99_s": p99})


def targets(run: Run) -> list[dict[str, Any]]:
    found = []

    def check(name: str, value: float, limit: float, ok: bool) -> None:
        if value == value:
            found.append({"target": name, "value": value, "limit": limit, "met": ok})

    raw = {k: run.figure("raw", k) for k in ("p50_ms", "p99_ms", "rate")}
    for key, floor in (("broker bench.noop", "floor"), ("broker files.write", "floor files.write")):
        r50 = ratio(run.figure(key, "p50_ms"), run.figure(floor, "p50_ms"))
        r99 = ratio(run.figure(key, "p99_ms"), run.figure(floor, "p99_ms"))
        check(f"{key}: sequential p50 ≤ 1.25× its durable floor", r50, 1.25, r50 <= 1.25)
        check(f"{key}: sequential p99 ≤ 1.6× its durable floor", r99, 1.6, r99 <= 1.6)
    for key in ("broker bench.noop", "broker bench.noop ×1000"):
        rr = ratio(run.figure(key, "rate"), raw["rate"])
        check(f"{key}: burst ≥ 0.8× raw", rr, 0.8, rr >= 0.8)
    sqlite_rate = run.figure("broker bench.noop", "rate")
    for key in ("fleet ×1", "fleet ×2"):
        rr = ratio(run.figure(key, "rate"), sqlite_rate)
        check(f"{key}: burst on PostgreSQL ≥ 0.5× SQLite's", rr, 0.5, rr >= 0.5)
    cpu = run.figure("broker bench.noop", "burst_cpu_us").median
    check("broker bench.noop: server CPU ≤ 100 µs per request", cpu, 100.0, cpu <= 100.0)
    rss = run.figure("broker bench.noop", "VmHWM").median
    check("broker: peak RSS after its burst ≤ 80 MiB", rss, 80.0, rss <= 80.0)
    idle = run.figure("idle ×1000", "cpu_s_per_min")
    check("idle ×1000: < 0.1 CPU-s/min", idle.median, 0.1, idle.median < 0.1)
    docker = run.figure("start", "docker_s")
    for key, beside in (("broker_s", ""), ("thin_s", ", beside a serving broker")):
        start = ratio(run.figure("start", key), docker)
        check(f"broker run start ≤ 1.3× docker run{beside}", start, 1.3, start <= 1.3)
    for row in (r for r in table(run)[1] if "block_ratio" in r):
        block, begin = row["block_ratio"], row["start_ratio"]
        check(
            "SandboxCodeExecutor block ≤ 1.2× AutoGen's Docker executor", block, 1.2, block <= 1.2
        )
        check("SandboxCodeExecutor start-up ≤ 1.3× AutoGen's", begin, 1.3, begin <= 1.3)
    credential_rows.check_targets(run, check)
    return found


def _git() -> dict[str, Any]:
    def out(*argv: str) -> str:
        try:
            return subprocess.run(argv, capture_output=True, text=True, check=False).stdout
        except OSError:
            return ""

    return {
        "commit": out("git", "rev-parse", "HEAD").strip(),
        "dirty": sorted(
            line[3:] for line in out("git", "status", "--porcelain").splitlines() if line
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a ~1-minute run with fewer samples")
    parser.add_argument("--profile", action="store_true", help="profile the broker instead")
    parser.add_argument("--skip", nargs="*", default=[], choices=SECTIONS, metavar="SECTION")
    parser.add_argument("--dir", type=Path, help="where the run's files go (default: /tmp)")
    parser.add_argument("--keep", action="store_true", help="leave the run's files behind")
    parser.add_argument("--out", type=Path, help="the results JSON (default: bench/results/)")
    args = parser.parse_args(argv)

    base = Path(tempfile.mkdtemp(prefix="broker-bench-", dir=args.dir))
    cells = cases.Cells(base)
    started = time.monotonic()
    try:
        if args.profile:
            from bench import profile

            profile.run(cells, RESULTS / "profiles", quick=args.quick)
            return 0
        run = Run()
        measure(args, cells, run)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    text, rows = table(run)
    met = targets(run)
    stamp = dt.datetime.now(dt.UTC)
    print()
    print(text)
    print("targets:")
    for t in met:
        print(f"  {'met ' if t['met'] else 'MISSED'}  {t['target']}: {t['value']:.3g}")
    for note in run.notes:
        print(f"note: {note}")
    elapsed = time.monotonic() - started
    print(f"({elapsed:.0f} s; {'quick' if args.quick else 'full'} plan)")
    report = {
        "date": stamp.isoformat(timespec="seconds"),
        "plan": "quick" if args.quick else "full",
        "seconds": elapsed,
        "git": _git(),
        "host": {
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
            "python": platform.python_version(),
        },
        "probes": run.probes,
        "table": text,
        "rows": rows,
        "targets": met,
        "samples": run.samples,
        "notes": run.notes,
    }
    out = args.out or RESULTS / f"{stamp:%Y-%m-%dT%H%M%S}{'-quick' if args.quick else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
