"""Running git for git.push: one bare cache repository per remote, isolated from any
user or system config, the host's token in the environment (never on the command
line), and the spans its diffs and logs compare."""

from __future__ import annotations

import base64
import os
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from broker.errors import EffectFailed

TIMEOUT_S = 120.0
_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def _lock(key: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(key, threading.Lock())


@dataclass(frozen=True)
class Remote:
    name: str
    url: str
    token: str | None
    username: str
    default_branch: str


class GitError(EffectFailed):
    """A git command failed; the reason carries the tail of its stderr."""


class Git:
    """Runs git in one bare cache repository, isolated from any user or system config."""

    def __init__(self, repo: Path, remote: Remote | None = None) -> None:
        self.repo = repo
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(repo),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_ASKPASS": "/bin/false",
            "LC_ALL": "C",
        }
        if remote is not None and remote.token:
            basic = base64.b64encode(f"{remote.username}:{remote.token}".encode()).decode()
            # in the environment, not on the command line: other users cannot read it
            self.env.update(
                GIT_CONFIG_COUNT="1",
                GIT_CONFIG_KEY_0="http.extraHeader",
                GIT_CONFIG_VALUE_0=f"Authorization: Basic {basic}",
            )

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        try:
            done = subprocess.run(
                ["git", "-C", str(self.repo), *args],
                env=self.env,
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
                errors="replace",
            )
        except subprocess.TimeoutExpired as exc:
            raise GitError(f"failed: git {args[0]} took longer than {TIMEOUT_S:g}s") from exc
        except OSError as exc:
            raise GitError(f"failed: git cannot run on the host: {exc.strerror}") from exc
        if check and done.returncode != 0:
            tail = " ".join(done.stderr.strip().splitlines()[-3:])[:400]
            raise GitError(f"failed: git {args[0]}: {tail or 'exit ' + str(done.returncode)}")
        return done


# git's well-known empty tree: the base of a branch with no common history
_EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"


def _diff_span(base: str, new: str) -> list[str]:
    """What `git diff` compares: from the merge base, or from nothing for new history."""
    return [_EMPTY_TREE, new] if base == _EMPTY_TREE else [f"{base}...{new}"]
