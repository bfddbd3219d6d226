"""Reference servers a team might write instead: a 1-second polling loop, watchfiles.

    python -m bench.peers poll|watchfiles OUTBOX RESULTS

Each answers requests like bench.raw (read, parse, result by temp + rename).
"""

from __future__ import annotations

import os
import sys
import time

from bench.raw import handle


def poll(outbox: str, results: str, interval: float = 1.0) -> None:
    in_fd = os.open(outbox, os.O_RDONLY | os.O_DIRECTORY)
    out_fd = os.open(results, os.O_RDONLY | os.O_DIRECTORY)
    seen: set[str] = set()
    print("ready", flush=True)
    while True:
        for name in sorted(os.listdir(in_fd)):
            if name in seen or name.startswith(".") or not name.endswith(".json"):
                continue
            seen.add(name)
            handle(in_fd, out_fd, name, False)
        time.sleep(interval)


def watch(outbox: str, results: str) -> None:
    from watchfiles import Change, watch

    in_fd = os.open(outbox, os.O_RDONLY | os.O_DIRECTORY)
    out_fd = os.open(results, os.O_RDONLY | os.O_DIRECTORY)
    import threading

    # watch() sets its watch up only once iterated: say ready a little later
    threading.Timer(0.5, lambda: print("ready", flush=True)).start()
    for changes in watch(outbox):  # the defaults: debounce 1600 ms, step 50 ms
        for change, path in sorted(changes):
            name = os.path.basename(path)
            if change == Change.added and name.endswith(".json") and not name.startswith("."):
                handle(in_fd, out_fd, name, False)


if __name__ == "__main__":
    kind, outbox, results = sys.argv[1:4]
    (poll if kind == "poll" else watch)(outbox, results)
