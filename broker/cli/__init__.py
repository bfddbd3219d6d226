"""The `broker` command: parses, calls, prints. Every user error is one line.

The console script lands here and stays light: `broker run`, which every agent's start
pays for, goes to its own argparse path (broker.cli.run) without typer or rich; every
other command goes to typer's table (broker.cli.commands).
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["app", "main"]


def main() -> None:
    """The console script."""
    if sys.argv[1:2] == ["run"]:
        from broker.cli.run import main as run_main

        raise SystemExit(run_main(sys.argv[2:]))
    from broker.cli.commands import main as app_main

    app_main()


def __getattr__(name: str) -> Any:
    """`from broker.cli import app`: the typer table, imported when asked for."""
    if name == "app":
        from broker.cli.commands import app

        return app
    raise AttributeError(f"module 'broker.cli' has no attribute {name!r}")
