"""Instructions per request, counted by callgrind.

    python -m bench.instructions [N] [--burst] [--floor | --native]

On a shared machine the CPU time a request costs moves with the neighbours (cache
misses, steal, frequency); the number of user-space instructions it executes hardly
moves at all (±0.5% between runs here, at load 2 or 9). The server runs under
valgrind's callgrind with instrumentation off while it starts and warms up (30
requests), on for N bench.noop requests (sequential, or one burst), then off;
the count covers every thread of the server. `--floor` counts the durable floor
(bench.raw --journal) instead of the broker, `--native` the C prototype of the accept
path (bench/native). Needs valgrind; ~30 s for 200 requests.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import cases, procs


def _server(cell: Path, out: Path, kind: str) -> tuple[procs.Server, list[tuple[str, str]]]:
    grind = [
        "valgrind", "--tool=callgrind", "--instr-atstart=no",
        f"--callgrind-out-file={out}",
    ]  # fmt: skip
    if kind == "native":
        from bench.native import binary

        outbox, results, state = cell / "outbox", cell / "results", cell / "state"
        for folder in (outbox, results, state):
            folder.mkdir()
        argv = [*grind, str(binary()), str(outbox), str(results), str(state)]
        return procs.Server(argv, log=cell / "server.log", timeout=300), [
            (str(outbox), str(results))
        ]
    grind.append(sys.executable)
    if kind == "floor":
        outbox, results = cell / "outbox", cell / "results"
        outbox.mkdir()
        results.mkdir()
        argv = [*grind, "-m", "bench.raw", str(outbox), str(results)]
        argv += ["--journal", str(cell / "journal")]
        return procs.Server(argv, log=cell / "server.log", timeout=300), [
            (str(outbox), str(results))
        ]
    spec, pairs = cases._layout(cell, 1)
    argv = [*grind, "-m", "bench.server", json.dumps(spec)]
    return procs.Server(argv, log=cell / "server.log", timeout=300), pairs


def _instrument(pid: int, on: bool) -> None:
    subprocess.run(
        ["callgrind_control", "-i", "on" if on else "off", str(pid)],
        check=True,
        capture_output=True,
    )


def count(
    n: int, burst: bool = False, floor: bool = False, native: bool = False
) -> dict[str, float]:
    """Instructions per request (and how many requests were answered) of the broker, the
    durable floor (`floor`) or the native prototype (`native`)."""
    cases.BUDGET.update(seq_s=900.0, burst_s=900.0)
    with tempfile.TemporaryDirectory(prefix="broker-instructions-") as tmp:
        cell = cases.Cells(Path(tmp)).new("grind")
        out = Path(tmp) / "callgrind.out"
        kind = "native" if native else "floor" if floor else "broker"
        server, pairs = _server(cell, out, kind)
        live = cases.Live(pairs, "bench.noop", cell, [server])
        try:
            live.exercise(0, 0)  # the warm-up requests, not counted
            _instrument(server.pid, True)
            found = live.exercise(0, n) if burst else live.exercise(n, 0)
            _instrument(server.pid, False)
        finally:
            live.close()
        answered = found["burst"]["done"] if burst else found["n"]
        total = 0
        for part in Path(tmp).glob("callgrind.out*"):
            for line in part.read_text(errors="replace").splitlines():
                if line.startswith(("summary:", "totals:")):
                    total = max(total, int(line.split()[1]))
        return {"requests": answered, "instructions": total, "per_request": total / answered}


if __name__ == "__main__":
    args = sys.argv[1:]
    n = int(args[0]) if args and args[0].isdigit() else 200
    found = count(n, "--burst" in args, "--floor" in args, "--native" in args)
    print(
        f"{found['per_request'] / 1e6:.3f} M instructions per request"
        f" ({found['requests']:.0f} requests, {found['instructions'] / 1e6:.0f} M in all)"
    )
