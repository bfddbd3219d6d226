"""How the broker calls podman: its CLI as this process's user, or as another user (a
rootless Podman driven from root, via runuser with a clean environment); stdout back,
or a SandboxError carrying podman's last line of stderr."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from broker.errors import SandboxError

__all__ = ["CALL_TIMEOUT", "DEFAULT_CONF", "Podman"]

DEFAULT_CONF = "/etc/sandbox-broker/containers.conf"
"""Written by scripts/podman-up.sh; used when CONTAINERS_CONF is not set."""
CALL_TIMEOUT = 120
"""Seconds one podman command may take (an image build has its own)."""


@dataclass(frozen=True)
class Podman:
    """How to call podman: as this process's user, or as ``user`` (via runuser)."""

    user: str | None = None
    binary: str = "podman"

    def argv(self, args: Sequence[str]) -> list[str]:
        return [*self.prefix(), self.binary, *args]

    def prefix(self) -> list[str]:
        """What runs a command as ``user`` (nothing for this process's own user)."""
        if self.user is None:
            return []
        import pwd

        entry = pwd.getpwnam(self.user)
        conf = os.environ.get("CONTAINERS_CONF") or DEFAULT_CONF
        # a clean environment: nothing of this process's (XDG_* paths above all) is theirs;
        # and their home as the working dir: podman refuses to start in one they cannot
        # enter (this process's, under /root or a 0700 temp dir)
        return [
            *("runuser", "-u", self.user, "--", "env", "-i", f"--chdir={entry.pw_dir}"),
            f"HOME={entry.pw_dir}",
            f"PATH={os.environ.get('PATH', '/usr/bin:/bin')}",
            f"XDG_RUNTIME_DIR=/run/user/{entry.pw_uid}",
            f"CONTAINERS_CONF={conf}",
        ]

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.setdefault("CONTAINERS_CONF", DEFAULT_CONF)
        return env

    def __call__(self, *args: str, timeout: float = CALL_TIMEOUT) -> str:
        """Run podman; its stdout, or SandboxError with its stderr."""
        try:
            done = subprocess.run(
                self.argv(args),
                capture_output=True,
                text=True,
                timeout=timeout,
                env=self.env(),
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SandboxError(f"podman {args[0]} failed: {exc}") from exc
        if done.returncode != 0:
            detail = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
            raise SandboxError(f"podman {args[0]} failed: {detail[0]}")
        return done.stdout

    def exists(self, kind: str, ref: str) -> bool:
        """`podman image exists` / `container exists`: exit 0 yes, 1 no."""
        try:
            self(kind, "exists", ref)
        except SandboxError:
            return False
        return True

    def inspect(self, ref: str) -> dict[str, Any]:
        found: list[dict[str, Any]] = json.loads(self("container", "inspect", ref))
        return found[0]
