"""`broker run`'s exit (broker.cli.leave): without the interpreter's teardown, and
without losing what a normal exit does: the exit code, atexit's functions (logging's
flush, telemetry's export), a thread that is not a daemon, and buffered output."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _exit(body: str) -> subprocess.CompletedProcess[str]:
    code = textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )


def test_it_runs_what_exit_would_first() -> None:
    """An atexit function, a non-daemon thread's last write and an unflushed line all
    reach stdout, in exit's order, and the status is the code given."""
    done = _exit(
        """
        import atexit, sys, threading, time
        from broker.cli import leave

        atexit.register(lambda: print("atexit ran"))
        threading.Thread(target=lambda: (time.sleep(0.2), print("thread done"))).start()
        sys.stdout.write("buffered, no newline flush;")
        leave(7)
        """
    )
    assert done.returncode == 7
    assert done.stdout == "buffered, no newline flush;thread done\natexit ran\n"


def test_a_text_code_goes_to_stderr_with_status_1() -> None:
    """As SystemExit("text") would: the text on stderr, status 1; None is status 0."""
    texted = _exit("from broker.cli import leave\nleave('no such thing')")
    assert (texted.returncode, texted.stderr) == (1, "no such thing\n")
    assert _exit("from broker.cli import leave\nleave(None)").returncode == 0
