"""The `broker` command: parses, calls, prints. Every user error is one line.

The console script lands here and stays light: `broker run`, which every agent's start
pays for, goes to its own argparse path (broker.cli.run) without typer or rich; every
other command goes to typer's table (broker.cli.commands).
"""

from __future__ import annotations

import sys
from typing import Any, NoReturn

__all__ = ["app", "main"]


def main() -> None:
    """The console script."""
    if sys.argv[1:2] == ["run"]:
        from broker.cli.run import main as run_main

        code: object
        try:
            code = run_main(sys.argv[2:])
        except SystemExit as exc:
            code = exc.code
        leave(code)
    from broker.cli.commands import main as app_main

    app_main()


def leave(code: object) -> NoReturn:
    """Exit as SystemExit(code) would, without the interpreter's teardown.

    Once `broker run` has said its last line, what a normal exit adds is the freeing
    of every module's objects: 8–15 ms that every agent's run paid after its sandbox
    had gone. What exit does besides is done here first, in its order: the threads
    that are not daemons are joined, the atexit functions run (logging's flush,
    telemetry's export), stdout and stderr are flushed."""
    import atexit
    import os
    import threading

    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:  # SystemExit("text"): the text on stderr, status 1
        sys.stderr.write(f"{code}\n")
        status = 1
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: what exit would also meet
            status = status or 120
    os._exit(status)


def __getattr__(name: str) -> Any:
    """`from broker.cli import app`: the typer table, imported when asked for."""
    if name == "app":
        from broker.cli.commands import app

        return app
    raise AttributeError(f"module 'broker.cli' has no attribute {name!r}")
