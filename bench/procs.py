"""Server processes for the benchmark: start, wait until ready, read /proc, stop."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")


class Server:
    """A child process that prints "ready" on stdout once it serves."""

    def __init__(self, argv: list[str], *, log: Path, timeout: float = 60.0) -> None:
        self.log = log
        self._log_file = log.open("wb")
        self.proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=self._log_file,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert self.proc.stdout is not None
        line = b""
        end = time.monotonic() + timeout
        while b"ready" not in line:
            if self.proc.poll() is not None or time.monotonic() > end:
                self.stop()
                raise RuntimeError(f"{argv[:4]} did not start; see {log}")
            line = self.proc.stdout.readline()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def cpu_seconds(self) -> float:
        """User + system CPU of every thread so far, from /proc/<pid>/stat."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def memory(self) -> dict[str, float]:
        """VmRSS and VmHWM (peak) in MiB."""
        out = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) / 1024
        return out

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log_file.close()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def broker(spec: dict[str, Any], log: Path, timeout: float = 60.0) -> Server:
    argv = [sys.executable, "-m", "bench.server", json.dumps(spec)]
    return Server(argv, log=log, timeout=timeout)


def raw(
    outbox: Path,
    results: Path,
    log: Path,
    *,
    fsync: bool = False,
    journal: Path | None = None,
    write: Path | None = None,
) -> Server:
    argv = [sys.executable, "-m", "bench.raw", str(outbox), str(results)]
    if fsync:
        argv.append("--fsync")
    if journal is not None:
        argv += ["--journal", str(journal)]
    if write is not None:
        argv += ["--write", str(write)]
    return Server(argv, log=log)


def native(outbox: Path, results: Path, state: Path, log: Path) -> Server:
    """The C prototype of the accept path (bench/native), built first if needed."""
    from bench.native import binary

    return Server([str(binary()), str(outbox), str(results), str(state)], log=log)


def peer(kind: str, outbox: Path, results: Path, log: Path) -> Server:
    return Server([sys.executable, "-m", "bench.peers", kind, str(outbox), str(results)], log=log)
