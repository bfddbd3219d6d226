"""What makes SandboxCodeExecutor a drop-in for AutoGen's DockerCommandLineCodeExecutor:
its keyword arguments (and the ones the sandbox refuses by design, each saying why),
its component config, the `# filename:` convention kept inside the work dir, a
caller-made work dir the sandbox can write without widening its permissions, and
containers left by an interpreter that died reaped at the next start.
"""

from __future__ import annotations

import os
import posixpath
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import docker
import docker.errors
from pydantic import BaseModel

from broker.hosting import sandbox

__all__ = [
    "EXECUTOR_LABEL",
    "SandboxCodeExecutorConfig",
    "code_filename",
    "owner_label",
    "read_only_volumes",
    "reap_orphans",
    "refuse_by_design",
    "workspace_user",
]

EXECUTOR_LABEL = "broker.autogen.owner"
"""On each executor's container: `<hostname>:<pid>` of the process that started it."""
WORKSPACE = "/workspace"


class SandboxCodeExecutorConfig(BaseModel):
    """The executor's component config (`dump_component` / `load_component`)."""

    config: str | None = None
    image: str | None = None
    container_name: str | None = None
    timeout: int = 60
    work_dir: str | None = None
    auto_remove: bool = True
    stop_container: bool = True
    extra_volumes: dict[str, dict[str, str]] = {}
    init_command: str | None = None
    delete_tmp_files: bool = False


def refuse_by_design(
    *,
    auto_remove: bool,
    bind_dir: Any,
    device_requests: Any,
    functions: Any,
    extra_hosts: Any,
) -> None:
    """AutoGen's arguments the sandbox refuses, each with the reason (docs/autogen.md)."""
    if not auto_remove:
        raise ValueError(
            "auto_remove=False is refused by design: a stopped sandbox is always removed "
            "(its outbox, results and work_dir stay); `broker sandbox ls` shows running ones"
        )
    if bind_dir is not None:
        raise ValueError(
            "bind_dir is refused by design: the sandbox mounts its own dirs; give work_dir"
        )
    if device_requests:
        raise ValueError("device_requests are refused by design: the sandbox gets no devices")
    if functions:
        raise ValueError(
            "functions are refused by design: installing their requirements needs the "
            "network the sandbox does not have; put the code in a block (or the image)"
        )
    if extra_hosts:
        raise ValueError(
            "extra_hosts are refused by design: the sandbox has no network; what it needs "
            "from the world goes through the outbox"
        )


def read_only_volumes(extra_volumes: Mapping[str, Mapping[str, str]] | None) -> dict[str, str]:
    """AutoGen's `{host: {"bind": path, "mode": "ro"}}` as host → container paths;
    a writable volume is refused by design."""
    mounts: dict[str, str] = {}
    for host, spec in (extra_volumes or {}).items():
        mode = spec.get("mode", "rw")
        if mode != "ro":
            raise ValueError(
                f"extra_volumes[{host!r}]: mode {mode!r} is refused by design: only read-only "
                'volumes ("mode": "ro") are mounted; what leaves the sandbox goes through '
                "the outbox, where the policy sees it"
            )
        bind = spec.get("bind")
        if not bind or not bind.startswith("/"):
            raise ValueError(f"extra_volumes[{host!r}]: bind must be an absolute container path")
        mounts[str(Path(host).absolute())] = bind
    return mounts


def code_filename(code: str, work_dir: Path) -> str | None:
    """The `# filename: x.py` of a block's first line, relative to the work dir; None
    without one; ValueError for a path outside it. Decided on the text alone, never by
    following a link the sandbox could have planted."""
    first = code.split("\n", 1)[0]
    if not first.startswith("# filename:"):
        return None
    name = first.split(":", 1)[1].strip()
    if not name:
        return None
    for root in (str(work_dir), WORKSPACE):
        if name == root or name.startswith(root.rstrip("/") + "/"):
            name = name[len(root) :].lstrip("/")  # an absolute path inside the work dir
            break
    relative = posixpath.normpath(name)
    if name.startswith("/") or relative == ".." or relative.startswith("../"):
        raise ValueError(f"{name} is not in the workspace")
    if relative in (".", ""):
        return None
    return relative


def workspace_user(where: Path) -> tuple[str, int | None]:
    """The user blocks run as for this work dir, and the uid to give the dir back to at
    stop (None: nothing changed). A dir of an ordinary user: that user (the sandbox gets
    exactly its rights there, no wider); of root, or made for the sandbox: the sandbox's
    uid, the dir (not what is in it) handed to it for the executor's life."""
    st = where.stat()
    if st.st_uid == sandbox.SANDBOX_UID or (st.st_uid != 0 and st.st_mode & 0o002):
        return f"{sandbox.SANDBOX_UID}:{sandbox.SANDBOX_UID}", None
    if st.st_uid != 0:
        return f"{st.st_uid}:{st.st_gid}", None
    os.chown(where, sandbox.SANDBOX_UID, -1)
    return f"{sandbox.SANDBOX_UID}:{sandbox.SANDBOX_UID}", 0


def owner_label() -> dict[str, str]:
    return {EXECUTOR_LABEL: f"{socket.gethostname()}:{os.getpid()}"}


def reap_orphans(client: docker.DockerClient) -> int:
    """Remove executor containers whose process on this host has gone (it was killed
    before its exit handler ran); returns how many."""
    me = socket.gethostname()
    reaped = 0
    try:
        found = client.containers.list(all=True, filters={"label": EXECUTOR_LABEL})
    except docker.errors.DockerException:
        return 0
    for container in found:
        host, _, pid = str(container.labels.get(EXECUTOR_LABEL, "")).rpartition(":")
        if host != me or not pid.isdigit() or alive(int(pid)):
            continue
        sandbox.remove(container)
        reaped += 1
    return reaped


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
