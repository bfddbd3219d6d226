"""Per-stage costs of one request, each measured alone: python -m bench.micro

What each stage of the broker's data path costs on this machine, so that a change
can be weighed before it is made: validation (jsonschema, and jsonschema-rs when
installed), a SQLite commit with synchronous=FULL (one row, and per row in a group),
an audit append with and without fsync, a result write, the claim rename and unlink,
and the thread handoffs (a queue put/get, a pool round trip).
"""

from __future__ import annotations

import json
import os
import queue
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.stats import percentile


def timeit(fn: Callable[[], Any], n: int) -> dict[str, float]:
    took = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        took.append(time.perf_counter() - start)
    return {"p50_us": percentile(took, 50) * 1e6, "p99_us": percentile(took, 99) * 1e6}


def validation(n: int) -> dict[str, dict[str, float]]:
    from bench.handlers import NOOP_SCHEMA
    from broker.validation import Validator, load_schema

    validator = Validator({"bench.noop": NOOP_SCHEMA, "files.write": load_schema("files.write")})
    doc = {
        "version": 1,
        "id": "abc123",
        "effect": "files.write",
        "params": {"path": "bench/x.txt", "content": "hello\n"},
    }

    def stdlib() -> None:
        validator.envelope(doc)
        validator.params("files.write", doc["params"])

    out = {"jsonschema (envelope + params)": timeit(stdlib, n)}
    try:
        import jsonschema_rs
    except ImportError:
        return out
    env = jsonschema_rs.Draft202012Validator(load_schema("envelope"))
    params = jsonschema_rs.Draft202012Validator(load_schema("files.write"))

    def rs() -> None:
        if not (env.is_valid(doc) and params.is_valid(doc["params"])):
            raise AssertionError

    out["jsonschema-rs is_valid (envelope + params)"] = timeit(rs, n)
    return out


def sqlite_commits(folder: Path, n: int) -> dict[str, dict[str, float]]:
    from broker.store.sqlite import SCHEMA

    db = sqlite3.connect(folder / "ledger.sqlite3", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.executescript(SCHEMA)
    counter = iter(range(10**9))
    payload = json.dumps({"params": {"content": "x" * 100}})

    def row() -> None:
        i = next(counter)
        db.execute(
            "INSERT INTO requests (sandbox, id, name, effect, payload, state, received_at) "
            "VALUES ('s', ?, ?, 'bench.noop', ?, 'applied', '2026-01-01T00:00:00Z')",
            (f"r{i}", f"r{i}", payload),
        )
        db.execute("INSERT INTO audit_queue (event) VALUES (?)", (payload,))

    def one() -> None:
        db.execute("BEGIN IMMEDIATE")
        row()
        db.execute("COMMIT")

    def group() -> None:
        db.execute("BEGIN IMMEDIATE")
        for _ in range(100):
            row()
        db.execute("COMMIT")

    out = {"SQLite commit, 1 row, synchronous=FULL": timeit(one, n)}
    g = timeit(group, max(5, n // 20))
    out["SQLite, per row in a 100-row commit"] = {k: v / 100 for k, v in g.items()}
    db.close()
    return out


def files(folder: Path, n: int) -> dict[str, dict[str, float]]:
    from broker.lifecycle import results
    from broker.models import Result

    res = folder / "results"
    res.mkdir()
    res_fd = os.open(res, os.O_RDONLY | os.O_DIRECTORY)
    counter = iter(range(10**9))
    result = Result(id="x", status="applied", effect="bench.noop", reason="applied")

    def write() -> None:
        results.write_bytes(res_fd, f"r{next(counter)}.json", results.render(result))

    out = {"result write (create, write, rename)": timeit(write, n)}

    log = folder / "audit.jsonl"
    line = b'{"seq":1,"event":"applied","hash":"' + b"0" * 64 + b'"}\n'

    def append(sync: bool) -> Callable[[], None]:
        def run() -> None:
            fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            os.write(fd, line * 3)
            if sync:
                os.fsync(fd)
            os.close(fd)

        return run

    out["audit append, no fsync"] = timeit(append(False), n)
    out["audit append + fsync"] = timeit(append(True), n)

    outbox, claim = folder / "outbox", folder / "claim"
    outbox.mkdir()
    claim.mkdir()
    o_fd = os.open(outbox, os.O_RDONLY | os.O_DIRECTORY)
    c_fd = os.open(claim, os.O_RDONLY | os.O_DIRECTORY)
    for i in range(n):
        (outbox / f"q{i}.json").write_bytes(b"{}")
    names = iter(range(n))

    def claim_rename() -> None:
        i = next(names)
        os.rename(f"q{i}.json", f"q{i}.json~1", src_dir_fd=o_fd, dst_dir_fd=c_fd)

    out["claim rename (outbox → claim dir)"] = timeit(claim_rename, n)
    names = iter(range(n))

    def unlink() -> None:
        os.unlink(f"q{next(names)}.json~1", dir_fd=c_fd)

    out["unlink of the consumed request"] = timeit(unlink, n)
    return out


def handoffs(n: int) -> dict[str, dict[str, float]]:
    q: queue.Queue[float] = queue.Queue()
    back: queue.Queue[float] = queue.Queue()

    def echo() -> None:
        while True:
            item = q.get()
            if item < 0:
                return
            back.put(item)

    thread = threading.Thread(target=echo, daemon=True)
    thread.start()

    def round_trip() -> None:
        q.put(1.0)
        back.get()

    out = {"queue round trip to a waiting thread (2 handoffs)": timeit(round_trip, n)}
    q.put(-1.0)
    pool = ThreadPoolExecutor(max_workers=4)
    done: queue.Queue[int] = queue.Queue()

    def hop() -> None:
        pool.submit(done.put, 1)
        done.get()

    out["thread-pool hop and back through a queue"] = timeit(hop, n)
    pool.shutdown()
    return out


def run(n: int = 300) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory(prefix="broker-micro-") as tmp:
        folder = Path(tmp)
        out: dict[str, dict[str, float]] = {}
        out.update(validation(n * 5))
        out.update(sqlite_commits(folder, n))
        out.update(files(folder, n))
        out.update(handoffs(n * 5))
        return out


def show(found: dict[str, dict[str, float]]) -> str:
    lines = [f"  {'stage':<52} {'p50 µs':>9} {'p99 µs':>9}"]
    for name, fig in found.items():
        lines.append(f"  {name:<52} {fig['p50_us']:>9.1f} {fig['p99_us']:>9.1f}")
    return "\n".join(lines)


if __name__ == "__main__":
    found = run(int(sys.argv[1]) if len(sys.argv) > 1 else 300)
    print(show(found))
