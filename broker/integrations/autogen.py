"""AutoGen on the broker: a code executor in a hardened sandbox, and an approval gate.

    from autogen_agentchat.agents import CodeExecutorAgent
    from broker.integrations.autogen import SandboxCodeExecutor, approval_func

    async with SandboxCodeExecutor() as executor:
        agent = CodeExecutorAgent(
            "executor", code_executor=executor, approval_func=approval_func(executor=executor)
        )

`SandboxCodeExecutor` runs every block in one sandbox container for its lifetime,
started like `broker run` starts one (no network, read-only root, no capabilities,
uid 10001, limits, `/outbox` and read-only `/results`, `import outbox` available), and
its outbox is served by the broker: the one already serving the state dir, else one
the executor runs until it stops. `approval_func` files each proposed execution as a
`code.execute` request, so the policy decides it, a person approves or denies it on
any of the broker's surfaces, and the audit log records who did.

Needs ``pip install 'sandbox-outbox-broker[autogen]'`` (AutoGen 0.7).
"""

from __future__ import annotations

import asyncio
import atexit
import hashlib
import json
import os
import secrets
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

from autogen_core import CancellationToken, Component
from autogen_core.code_executor import CodeBlock, CodeExecutor
from autogen_ext.code_executors._common import CommandLineCodeResult

from broker.config import Config, load_config
from broker.errors import SandboxError
from broker.hosting import images, sandbox, warm
from broker.hosting.runtimes.docker import DockerRuntime
from broker.integrations import autogen_compat as compat
from broker.integrations import autogen_warm
from broker.integrations import embedded as hosting
from broker.integrations.autogen_runs import result as _result
from broker.integrations.autogen_runs import run_all
from broker.integrations.blocks import INTERPRETERS, REAPER, Container

__all__ = ["ApprovalFunc", "SandboxCodeExecutor", "approval_func"]


class SandboxCodeExecutor(CodeExecutor, Component[compat.SandboxCodeExecutorConfig]):
    """Runs code blocks in one hardened sandbox container, served by the broker.

    `config` is broker.toml's path (default: ``$BROKER_CONFIG``, else the state dir's);
    `image` the agent image (default: ``[sandbox] image``, else the built-in one, built
    when missing); `timeout` the seconds each block may run; `work_dir` the host dir
    mounted at /workspace, the blocks' working dir (default: a fresh one beside the
    sandbox's outbox, removed on `stop`). Python (python, python3, py) and shell (sh,
    shell, bash) blocks run; other languages get a result saying so. The other keyword
    arguments are DockerCommandLineCodeExecutor's, with its meaning; the ones the
    sandbox refuses by design raise ValueError saying why (docs/autogen.md).
    """

    component_config_schema = compat.SandboxCodeExecutorConfig
    component_provider_override = "broker.integrations.autogen.SandboxCodeExecutor"

    def __init__(
        self,
        config: str | os.PathLike[str] | None = None,
        *,
        image: str | None = None,
        container_name: str | None = None,
        timeout: int = 60,
        work_dir: str | os.PathLike[str] | None = None,
        auto_remove: bool = True,
        stop_container: bool = True,
        extra_volumes: dict[str, dict[str, str]] | None = None,
        init_command: str | None = None,
        delete_tmp_files: bool = False,
        bind_dir: str | os.PathLike[str] | None = None,
        device_requests: Sequence[Any] | None = None,
        functions: Sequence[Any] = (),
        extra_hosts: dict[str, str] | None = None,
    ) -> None:
        if timeout < 1:
            raise ValueError("timeout must be at least 1 second")
        compat.refuse_by_design(
            auto_remove=auto_remove,
            bind_dir=bind_dir,
            device_requests=device_requests,
            functions=functions,
            extra_hosts=extra_hosts,
        )
        self._mounts = compat.read_only_volumes(extra_volumes)
        self._extra_volumes = dict(extra_volumes or {})
        self._config_path = Path(config) if config is not None else None
        self._image = image
        self._container_name = container_name
        self._timeout = timeout
        self._stop_container = stop_container
        self._init_command = init_command
        self._delete_tmp_files = delete_tmp_files
        self._work_dir_arg = Path(work_dir).absolute() if work_dir is not None else None
        self._work_dir: Path | None = None
        self._user = f"{sandbox.SANDBOX_UID}:{sandbox.SANDBOX_UID}"
        self._give_back: int | None = None  # the work_dir's uid before start, if changed
        self._config: Config | None = None
        self._served: hosting.Served | None = None
        self._container: Container | None = None
        self._gated = False  # set by approval_func(executor=self): only approved code runs
        self._approved: dict[str, int] = {}

    # -- what callers may read ------------------------------------------------------

    @property
    def timeout(self) -> int:
        """Seconds each block may run before it is stopped."""
        return self._timeout

    def _to_config(self) -> compat.SandboxCodeExecutorConfig:
        return compat.SandboxCodeExecutorConfig(
            config=str(self._config_path) if self._config_path else None,
            image=self._image,
            container_name=self._container_name,
            timeout=self._timeout,
            work_dir=str(self._work_dir_arg) if self._work_dir_arg else None,
            stop_container=self._stop_container,
            extra_volumes=self._extra_volumes,
            init_command=self._init_command,
            delete_tmp_files=self._delete_tmp_files,
        )

    @classmethod
    def _from_config(cls, config: compat.SandboxCodeExecutorConfig) -> Self:
        return cls(
            config.config,
            image=config.image,
            container_name=config.container_name,
            timeout=config.timeout,
            work_dir=config.work_dir,
            auto_remove=config.auto_remove,
            stop_container=config.stop_container,
            extra_volumes=config.extra_volumes,
            init_command=config.init_command,
            delete_tmp_files=config.delete_tmp_files,
        )

    @property
    def running(self) -> bool:
        return self._container is not None

    @property
    def sandbox_id(self) -> str:
        """The sandbox's id (its outbox is <state>/sandboxes/<id>/outbox); once started."""
        return self._paths.sandbox_id

    @property
    def work_dir(self) -> Path:
        """The host dir mounted at /workspace; once started."""
        if self._work_dir is None:
            raise ValueError("the executor has not started")
        return self._work_dir

    @property
    def config(self) -> Config:
        """The broker configuration in force; once started."""
        if self._config is None:
            raise ValueError("the executor has not started")
        return self._config

    @property
    def _paths(self) -> sandbox.SandboxPaths:
        if self._served is None:
            raise ValueError("the executor has not started")
        return self._served.paths

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Start the sandbox (and a broker for it, if none serves the state dir)."""
        if self._container is None:
            await asyncio.to_thread(self._start)

    async def stop(self) -> None:
        """Remove the container; a broker run for it drains the outbox, then stops."""
        await asyncio.to_thread(self._stop)

    async def restart(self) -> None:
        """A fresh container on the same sandbox (outbox, results, work_dir kept)."""
        await asyncio.to_thread(self._restart)

    def _start(self) -> None:
        cfg = self._config = load_config(self._config_path)
        taken = self._take_warm(cfg)
        sandbox_id = taken.sandbox_id if taken else f"autogen-{secrets.token_hex(4)}"
        served = self._served = hosting.serve(cfg, sandbox_id)
        try:
            self._work_dir = self._workspace(served.paths)
            self._container = self._launch(taken) if taken else self._new_container()
            self._init()
        except BaseException:
            self._stop()
            raise
        if self._stop_container:
            atexit.register(self._stop)  # as AutoGen's own stops its container at exit

    def _init(self) -> None:
        if self._init_command and self._container is not None:
            code, output = self._container.shell(["sh", "-c", self._init_command])
            if code != 0:
                raise SandboxError(f"init_command exited {code}: {output.strip()[-500:]}")

    def _take_warm(self, cfg: Config) -> warm.Warm | None:
        """A ready container from this process's pool ([sandbox] warm = N), unless what
        this executor mounts or names is fixed at creation."""
        if self._work_dir_arg or self._container_name or self._mounts:
            return None
        image = self._image or str(cfg.sandbox.get("image", images.DEFAULT_IMAGE))
        pool = autogen_warm.pool_for(cfg, image)
        return pool.take() if pool is not None else None

    def _launch(self, taken: warm.Warm) -> Container:
        """Hand the pooled container its reaper as PID 1; it is this executor's now."""
        handle = warm.launch(taken, ["python3", "-c", REAPER], DockerRuntime())
        client = sandbox.engine()  # blocks `exec` through docker-py
        try:
            return Container.adopt(client, client.containers.get(str(handle.id)), self._user)
        except BaseException:
            client.close()
            raise

    def _new_container(self) -> Container:
        from broker.hosting.runtimes import extra_env, limits_from

        cfg, paths = self.config, self._paths
        client = sandbox.engine()
        image = self._image or str(cfg.sandbox.get("image", images.DEFAULT_IMAGE))
        if image == images.DEFAULT_IMAGE:
            images.ensure_image(client, image, log=lambda text: None)
        compat.reap_orphans(client)
        return Container(
            client,
            paths,
            image,
            limits=limits_from(cfg),
            env=extra_env(cfg),
            workspace=self._work_dir,
            user=self._user,
            name=self._container_name,
            read_only_mounts=self._mounts,
            labels=compat.owner_label(),
        )

    def _stop(self) -> None:
        atexit.unregister(self._stop)
        container, self._container = self._container, None
        try:
            if container is not None:
                container.remove()
        finally:
            if self._served is not None:
                self._served.close()
            if self._work_dir_arg is None and self._work_dir is not None:
                shutil.rmtree(self._work_dir, ignore_errors=True)
            elif self._give_back is not None and self._work_dir is not None:
                os.chown(self._work_dir, self._give_back, -1)
                self._give_back = None

    def _restart(self) -> None:
        if self._container is None:
            raise ValueError("the executor has not started")
        old, self._container = self._container, None
        old.remove()
        self._container = self._new_container()

    def _workspace(self, paths: sandbox.SandboxPaths) -> Path:
        where = self._work_dir_arg or paths.root / "workspace"
        if not where.exists():
            where.mkdir(mode=0o755, parents=True)
            os.chown(where, sandbox.SANDBOX_UID, sandbox.SANDBOX_UID)
        self._user, self._give_back = compat.workspace_user(where)
        uid, gid = (int(part) for part in self._user.split(":"))
        if uid != sandbox.SANDBOX_UID:  # blocks run as the dir's owner: the outbox is theirs
            os.chown(paths.outbox, uid, gid)
        return where

    # -- running code ---------------------------------------------------------------

    async def execute_code_blocks(
        self, code_blocks: list[CodeBlock], cancellation_token: CancellationToken
    ) -> CommandLineCodeResult:
        """Run the blocks in order, stopping at the first that fails; each block's code is
        also written to the work dir (its `# filename:`, else `tmp_code_<sha256>.<lang>`)
        and `code_file` names the first, as AutoGen's executors do.

        Raises asyncio.CancelledError when `cancellation_token` is cancelled (autogen-core's
        CodeExecutor contract): the running block is killed (only it: the sandbox and its
        other processes stay).
        """
        container = self._container
        if container is None:
            raise ValueError("the executor is not running: start it, or use `async with`")
        if not code_blocks:
            raise ValueError("No code blocks to execute.")
        unknown = sorted(
            {b.language for b in code_blocks if b.language.lower() not in INTERPRETERS}
        )
        if unknown:
            return _result(
                1,
                f"unsupported language {', '.join(map(repr, unknown))}: this executor "
                "runs python and shell (sh, bash) blocks; nothing ran",
            )
        if self._gated and not self._take_approval(code_blocks):
            return _result(
                1,
                "not approved: these blocks were not approved by this executor's "
                "approval_func; nothing ran",
            )
        return await run_all(
            container,
            code_blocks,
            cancellation_token,
            work_dir=self.work_dir,
            timeout=self._timeout,
            delete_files=self._delete_tmp_files,
        )

    @property
    def served_paths(self) -> sandbox.SandboxPaths:
        """The sandbox's dirs (outbox, results); once started."""
        return self._paths

    def require_approval(self) -> None:
        """From now on run only blocks `allow` let through (approval_func's executor)."""
        self._gated = True

    def allow(self, blocks: Sequence[CodeBlock]) -> None:
        """Let these blocks, exactly, run once."""
        digest = _digest(blocks)
        self._approved[digest] = self._approved.get(digest, 0) + 1

    def _take_approval(self, blocks: Sequence[CodeBlock]) -> bool:
        digest = _digest(blocks)
        left = self._approved.get(digest, 0)
        if left <= 0:
            return False
        self._approved[digest] = left - 1
        return True


def _digest(blocks: Sequence[CodeBlock]) -> str:
    pairs = [[b.language, b.code] for b in blocks]
    return hashlib.sha256(json.dumps(pairs, ensure_ascii=False).encode()).hexdigest()


from broker.integrations.autogen_approval import (  # noqa: E402  (re-exported)
    ApprovalFunc,
    approval_func,
)
