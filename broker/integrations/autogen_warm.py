"""The AutoGen executor's warm pool: with ``[sandbox] warm = N``, executors of this
process take their container ready-made (created, proven, started, its workspace made)
instead of creating one, and only hand it their reaper as PID 1.

One pool per state dir and settings in this process, started by the first executor
that could use it and closed at exit (or by :func:`close_pools`). Its entries live
under ``<state>/warm-autogen/<host>-<pid>/``, out of `broker serve`'s pool's way; a
dead process's are removed by the next pool made on the host. Executors given a
work_dir, a container_name or extra_volumes start cold: those are fixed at creation.
"""

from __future__ import annotations

import atexit
import os
import socket
import threading
from dataclasses import replace
from pathlib import Path

from broker.config import Config
from broker.hosting import warm
from broker.hosting.runtimes.base import Runtime
from broker.hosting.warm_keeper import WarmPool
from broker.integrations import autogen_compat as compat

__all__ = ["close_pools", "pool_for"]

_pools: dict[tuple[Path, str], WarmPool] = {}
_lock = threading.Lock()


def _root(state_dir: Path, owner: str) -> Path:
    return state_dir / "warm-autogen" / owner


def pool_for(config: Config, image: str) -> WarmPool | None:
    """This process's pool for ``config`` and ``image``, started; None when warm is 0."""
    size = warm.count(config)
    if size == 0:
        return None
    found = replace(warm.settings(config, "docker", kind="autogen", workspace=True), image=image)
    with _lock:
        pool = _pools.get((config.state_dir, found.key))
        if pool is None:
            from broker.hosting.runtimes.docker import DockerRuntime

            runtime = DockerRuntime()
            _sweep_dead(runtime, config.state_dir, found)
            me = f"{socket.gethostname()}-{os.getpid()}"
            pool = WarmPool(
                runtime,
                config.state_dir,
                found,
                size,
                root=_root(config.state_dir, me),
                workspace=True,
                labels=compat.owner_label(),
                own_runtime=True,
            )
            if not _pools:
                atexit.register(close_pools)
            _pools[(config.state_dir, found.key)] = pool
        pool.start()
    return pool


def close_pools() -> None:
    """Remove every idle container of this process's pools and join their threads."""
    with _lock:
        pools = list(_pools.values())
        _pools.clear()
    for pool in pools:
        pool.close()


def _sweep_dead(runtime: Runtime, state_dir: Path, found: warm.Settings) -> None:
    """Drain the pools of processes of this host that have gone (their containers, if
    compat.reap_orphans has not removed them yet, and their sandbox dirs)."""
    base = state_dir / "warm-autogen"
    host = socket.gethostname()
    for root in sorted(base.iterdir()) if base.is_dir() else ():
        name, _, pid = root.name.rpartition("-")
        if name != host or not pid.isdigit() or compat.alive(int(pid)):
            continue
        WarmPool(runtime, state_dir, found, 0, root=root).close()
        _rmtree(root)


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
