"""AutoGen's code blocks run in the executor's sandbox container: in order, stopping at
the first that fails, each under the executor's timeout and AutoGen's cancellation token;
a block cut short is killed alone (the container and its other processes stay)."""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from pathlib import Path

from autogen_core import CancellationToken
from autogen_core.code_executor import CodeBlock
from autogen_ext.code_executors._common import CommandLineCodeResult

from broker.errors import SandboxError
from broker.integrations import autogen_compat as compat
from broker.integrations.blocks import INTERPRETERS, Container, Run

__all__ = ["TIMEOUT_EXIT", "result", "run_all"]

TIMEOUT_EXIT = 124  # what `timeout(1)` and AutoGen's executors report for a block cut short


async def run_all(
    container: Container,
    blocks: list[CodeBlock],
    token: CancellationToken,
    *,
    work_dir: Path,
    timeout: int,
    delete_files: bool,
) -> CommandLineCodeResult:
    """Each block saved to the work dir (its `# filename:`, else `tmp_code_<sha256>.<lang>`)
    and run; `code_file` names the first, as AutoGen's executors do."""
    outputs: list[str] = []
    files: list[str] = []
    exit_code = 0
    try:
        for block in blocks:
            if token.is_cancelled():
                raise asyncio.CancelledError
            try:
                name = compat.code_filename(block.code, work_dir) or _tmp_name(block)
            except ValueError:
                outputs.append("Filename is not in the workspace")
                exit_code = 1
                break
            files.append(name)
            try:
                run = await _run(container, block, token, name, timeout)
            except SandboxError as exc:
                outputs.append(f"sandbox error: {exc}")
                exit_code = 1
                break
            outputs.append(run.output)
            exit_code = run.exit_code
            if exit_code != 0:
                break
    finally:
        if delete_files and files:
            await asyncio.to_thread(container.shell, ["rm", "-f", "--", *files])
    code_file = str(work_dir / files[0]) if files else None
    return result(exit_code, "".join(outputs), code_file)


async def _run(
    container: Container, block: CodeBlock, token: CancellationToken, save: str, timeout: int
) -> Run:
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
        asyncio.to_thread(
            container.run, interpreter, block.code, marker, f"{compat.WORKSPACE}/{save}"
        )
    )
    waiter = asyncio.ensure_future(cancelled.wait())
    try:
        done, _ = await asyncio.wait(
            {job, waiter}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
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
        run.output + f"\nTimeout: the block ran longer than {timeout}s and was stopped",
    )


def result(exit_code: int, output: str, code_file: str | None = None) -> CommandLineCodeResult:
    return CommandLineCodeResult(exit_code=exit_code, output=output, code_file=code_file)


def _tmp_name(block: CodeBlock) -> str:
    digest = hashlib.sha256(block.code.encode("utf-8")).hexdigest()
    return f"tmp_code_{digest}.{block.language.lower()}"


async def _kill(container: Container, marker: str, job: asyncio.Future[Run]) -> Run:
    await asyncio.to_thread(container.kill, marker)
    return await job
