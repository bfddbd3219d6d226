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
import hashlib
import json
import os
import re
import secrets
import shutil
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from autogen_agentchat.agents import ApprovalRequest, ApprovalResponse
from autogen_core import CancellationToken
from autogen_core.code_executor import CodeBlock, CodeExecutor, CodeResult

from broker.config import Config, load_config
from broker.errors import BrokerError, SandboxError
from broker.hosting import sandbox
from broker.integrations import autogen_gate as gate
from broker.integrations import embedded as hosting
from broker.integrations.blocks import INTERPRETERS, Container, Run
from broker.loop import ownership

__all__ = ["ApprovalFunc", "SandboxCodeExecutor", "approval_func"]

ApprovalFunc = Callable[[ApprovalRequest], Awaitable[ApprovalResponse]]
TIMEOUT_EXIT = 124  # what `timeout(1)` and AutoGen's executors report for a block cut short
CONTEXT_MESSAGES = 10
_FENCE = re.compile(r"```([^\n`]*)\n(.*?)\n```", re.S)
_SANDBOX_ID = re.compile(r"[^A-Za-z0-9_.-]+")


class SandboxCodeExecutor(CodeExecutor):
    """Runs code blocks in one hardened sandbox container, served by the broker.

    `config` is broker.toml's path (default: ``$BROKER_CONFIG``, else the state dir's);
    `image` the agent image (default: ``[sandbox] image``, else the built-in one, built
    when missing); `timeout` the seconds each block may run; `work_dir` the host dir
    mounted at /workspace, the blocks' working dir (default: a fresh one beside the
    sandbox's outbox, removed on `stop`). Python (python, python3, py) and shell (sh,
    shell, bash) blocks run; other languages get a `CodeResult` saying so.
    """

    def __init__(
        self,
        config: str | os.PathLike[str] | None = None,
        *,
        image: str | None = None,
        timeout: int = 60,
        work_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if timeout < 1:
            raise ValueError("timeout must be at least 1 second")
        self._config_path = Path(config) if config is not None else None
        self._image = image
        self._timeout = timeout
        self._work_dir_arg = Path(work_dir).absolute() if work_dir is not None else None
        self._work_dir: Path | None = None
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
        served = self._served = hosting.serve(cfg, f"autogen-{secrets.token_hex(4)}")
        try:
            self._work_dir = self._workspace(served.paths)
            self._container = self._new_container()
        except BaseException:
            self._stop()
            raise

    def _new_container(self) -> Container:
        from broker.hosting.runner import extra_env, limits_from

        cfg, paths = self.config, self._paths
        client = sandbox.engine()
        image = self._image or str(cfg.sandbox.get("image", sandbox.DEFAULT_IMAGE))
        if image == sandbox.DEFAULT_IMAGE:
            sandbox.ensure_image(client, image, log=lambda text: None)
        return Container(
            client,
            paths,
            image,
            limits=limits_from(cfg),
            env=extra_env(cfg),
            workspace=self._work_dir,
        )

    def _stop(self) -> None:
        container, self._container = self._container, None
        try:
            if container is not None:
                container.remove()
        finally:
            if self._served is not None:
                self._served.close()
            if self._work_dir_arg is None and self._work_dir is not None:
                shutil.rmtree(self._work_dir, ignore_errors=True)

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
        st = where.stat()
        if st.st_uid != sandbox.SANDBOX_UID and not st.st_mode & 0o002:
            raise SandboxError(
                f"work_dir {where} is not writable by uid {sandbox.SANDBOX_UID}, the "
                f"sandbox's user: chown {sandbox.SANDBOX_UID} {where}"
            )
        return where

    # -- running code ---------------------------------------------------------------

    async def execute_code_blocks(
        self, code_blocks: list[CodeBlock], cancellation_token: CancellationToken
    ) -> CodeResult:
        """Run the blocks in order, stopping at the first that fails.

        Raises asyncio.CancelledError when `cancellation_token` is cancelled: the
        running block is killed (only it: the sandbox and its other processes stay).
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
            return CodeResult(
                exit_code=1,
                output=f"unsupported language {', '.join(map(repr, unknown))}: this executor "
                "runs python and shell (sh, bash) blocks; nothing ran",
            )
        if self._gated and not self._take_approval(code_blocks):
            return CodeResult(
                exit_code=1,
                output="not approved: these blocks were not approved by this executor's "
                "approval_func; nothing ran",
            )
        outputs: list[str] = []
        exit_code = 0
        for block in code_blocks:
            if cancellation_token.is_cancelled():
                raise asyncio.CancelledError
            try:
                run = await self._run(container, block, cancellation_token)
            except SandboxError as exc:
                return CodeResult(exit_code=1, output="".join(outputs) + f"sandbox error: {exc}")
            outputs.append(run.output)
            exit_code = run.exit_code
            if exit_code != 0:
                break
        return CodeResult(exit_code=exit_code, output="".join(outputs))

    async def _run(self, container: Container, block: CodeBlock, token: CancellationToken) -> Run:
        """One block, with its timeout and cancellation; a stopped block is killed alone."""
        marker = secrets.token_hex(8)
        loop = asyncio.get_running_loop()
        cancelled = asyncio.Event()

        def on_cancel() -> None:
            try:
                loop.call_soon_threadsafe(cancelled.set)
            except RuntimeError:  # the loop has closed: nothing is waiting any more
                pass

        token.add_callback(on_cancel)
        interpreter = INTERPRETERS[block.language.lower()]
        job = asyncio.ensure_future(
            asyncio.to_thread(container.run, interpreter, block.code, marker)
        )
        waiter = asyncio.ensure_future(cancelled.wait())
        try:
            done, _ = await asyncio.wait(
                {job, waiter}, timeout=self._timeout, return_when=asyncio.FIRST_COMPLETED
            )
        except asyncio.CancelledError:
            await asyncio.shield(_kill(container, marker, job))
            raise
        finally:
            waiter.cancel()
        if job in done:
            return job.result()
        run = await asyncio.shield(_kill(container, marker, job))
        if cancelled.is_set():
            raise asyncio.CancelledError
        return Run(
            TIMEOUT_EXIT,
            run.output + f"\nTimeout: the block ran longer than {self._timeout}s and was stopped",
        )

    def _allow(self, blocks: Sequence[CodeBlock]) -> None:
        digest = _digest(blocks)
        self._approved[digest] = self._approved.get(digest, 0) + 1

    def _take_approval(self, blocks: Sequence[CodeBlock]) -> bool:
        digest = _digest(blocks)
        left = self._approved.get(digest, 0)
        if left <= 0:
            return False
        self._approved[digest] = left - 1
        return True


async def _kill(container: Container, marker: str, job: asyncio.Future[Run]) -> Run:
    await asyncio.to_thread(container.kill, marker)
    return await job


def _digest(blocks: Sequence[CodeBlock]) -> str:
    pairs = [[b.language, b.code] for b in blocks]
    return hashlib.sha256(json.dumps(pairs, ensure_ascii=False).encode()).hexdigest()


# -- the approval gate ----------------------------------------------------------------


def approval_func(
    config: str | os.PathLike[str] | None = None,
    *,
    executor: SandboxCodeExecutor | None = None,
    sandbox_id: str | None = None,
) -> ApprovalFunc:
    """An async `approval_func` for `CodeExecutorAgent` that asks the broker.

    Each call files the code (and the conversation's last messages) as a
    `code.execute` request: in `executor`'s sandbox when given (and then that executor
    runs only code approved this way), else in `sandbox_id`, else in a sandbox named
    for the agent, which a running `broker serve` must serve. It returns
    `ApprovalResponse(approved, reason)` with the reviewer's reason, the policy's on an
    automatic decision, or the expiry's. If the agent's run is cancelled meanwhile, the
    request is withdrawn: it ends `denied`, and the audit log says why.
    """
    if executor is not None and sandbox_id is not None:
        raise ValueError("give approval_func an executor or a sandbox_id, not both")
    if executor is not None:
        executor._gated = True
    cfg = None if executor is not None else load_config(Path(config) if config else None)

    async def approve(request: ApprovalRequest) -> ApprovalResponse:
        blocks = parse_blocks(request.code)
        try:
            where = await asyncio.to_thread(_where, executor, cfg, sandbox_id, request)
        except BrokerError as exc:
            return ApprovalResponse(approved=False, reason=f"denied: {exc}; nothing ran")
        runs_in = "sandbox" if executor is not None else "host"
        decision = await gate.ask(
            where[0], where[1], blocks, context_of(request.context), runs_in=runs_in
        )
        if decision.approved and executor is not None:
            executor._allow([CodeBlock(code=b["code"], language=b["language"]) for b in blocks])
        return ApprovalResponse(approved=decision.approved, reason=decision.reason)

    return approve


def _where(
    executor: SandboxCodeExecutor | None,
    cfg: Config | None,
    sandbox_id: str | None,
    request: ApprovalRequest,
) -> tuple[Config, sandbox.SandboxPaths]:
    """The configuration and served sandbox a request is filed in."""
    if executor is not None:
        if not executor.running:
            raise SandboxError("the executor has not started")
        return executor.config, executor._paths
    assert cfg is not None
    if not ownership.served(cfg.state_dir):
        raise SandboxError(
            f"no broker serves {cfg.state_dir}; start one with `broker serve` "
            "(or pass approval_func the executor)"
        )
    name = sandbox_id or _agent_sandbox(request)
    return cfg, hosting.served_by_running(cfg, name).detach().paths


def parse_blocks(code: str) -> list[dict[str, str]]:
    """The blocks in an ApprovalRequest's code (AutoGen joins them as fenced blocks)."""
    blocks = [
        {"language": m.group(1).strip() or "text", "code": m.group(2)}
        for m in _FENCE.finditer(code)
    ]
    return blocks or [{"language": "text", "code": code}]


def context_of(messages: Sequence[Any], limit: int = CONTEXT_MESSAGES) -> list[dict[str, str]]:
    """The conversation's last messages, as a reviewer reads them (system prompt left out)."""
    said = []
    for message in messages:
        if type(message).__name__ == "SystemMessage":
            continue
        source = getattr(message, "source", None) or type(message).__name__
        content = message.content if isinstance(message.content, str) else str(message.content)
        said.append({"source": str(source)[:200], "content": content[:20000]})
    return said[-limit:]


def _agent_sandbox(request: ApprovalRequest) -> str:
    sources = [getattr(m, "source", None) for m in request.context]
    name = next((s for s in reversed(sources) if isinstance(s, str) and s), "autogen")
    cleaned = _SANDBOX_ID.sub("-", name).strip("-.")[:64]
    return cleaned if cleaned[:1].isalnum() else f"agent-{cleaned}"[:64]
