"""Asking the broker whether code may run: a `code.execute` request, and its answer.

Host-side integrations (AutoGen's `approval_func`) file the request into a served
sandbox's outbox, exactly as an agent would, and wait for its terminal result without
blocking their event loop. The answer is only "yes" if the broker applied the very
request we wrote (its `request_sha256` is ours): a rewrite of the file in the outbox
before the broker claimed it never turns into approval for our code.

A caller that gives up (its task is cancelled) withdraws the request as an agent does
(outbox protocol version 2): a pending one is denied, "withdrawn by the agent", and the
audit log says so.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.config import Config
from broker.hosting import sandbox
from broker.models import PROTOCOL_VERSION, Request
from effects.code import canonical_language

__all__ = ["EFFECT", "WITHDRAWN", "Decision", "ask", "withdraw"]

EFFECT = "code.execute"
WITHDRAWN = "the agent's run was cancelled before anyone decided, so the code never ran"
log = logging.getLogger("broker.integrations")


@dataclass(frozen=True)
class Decision:
    """The broker's answer: may the code run, and the reason to tell the agent."""

    approved: bool
    reason: str
    status: str
    ref: str
    decided_by: str | None


async def ask(
    config: Config,
    paths: sandbox.SandboxPaths,
    blocks: Sequence[Mapping[str, str]],
    context: Sequence[Mapping[str, str]] = (),
    *,
    runs_in: str = "sandbox",
) -> Decision:
    """File a code.execute request for `blocks` and wait for the broker's terminal answer.

    `runs_in` says where the code will run: "sandbox" (an executor bound to this
    sandbox) or "host" (the caller's own process). The params are written in
    code.execute's canonical form, so the request the broker decides is byte for byte
    the one filed (its sha256 binds the approval)."""
    request = Request(
        sandbox=paths.sandbox_id,
        id=uuid.uuid4().hex,
        name="",
        effect=EFFECT,
        params={
            "blocks": [
                {"language": canonical_language(b["language"]), "code": b["code"]} for b in blocks
            ],
            "runs_in": runs_in,
            "context": [{"source": m["source"], "content": m["content"]} for m in context],
        },
    )
    await asyncio.to_thread(_write, paths.outbox, request)
    ref = f"{paths.sandbox_id}/{request.id}"
    try:
        result = await _terminal(paths.results, request.id)
    except asyncio.CancelledError:
        await asyncio.shield(asyncio.to_thread(withdraw, config, paths, request.id))
        raise
    return _decision(result, request, ref)


def _write(outbox: Path, request: Request) -> None:
    data = json.dumps(request.envelope(), ensure_ascii=False).encode("utf-8")
    tmp = outbox / f".{request.id}.json.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.rename(tmp, outbox / f"{request.id}.json")


async def _terminal(results: Path, request_id: str) -> dict[str, Any]:
    """The request's terminal result, waiting on the results dir (no polling loop)."""
    from watchfiles import awatch

    path = results / f"{request_id}.json"
    current = _read(path)
    if current is not None:
        return current
    stop = asyncio.Event()
    try:
        async for _ in awatch(
            results,
            watch_filter=lambda _change, where: where == str(path),
            stop_event=stop,
            recursive=False,
            rust_timeout=1000,  # look again now and then: an event may be missed
            yield_on_timeout=True,
            debounce=10,
            step=5,
        ):
            current = _read(path)
            if current is not None:
                return current
    finally:
        stop.set()
    raise asyncio.CancelledError  # awatch only ends when stopped


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_bytes())
    except (FileNotFoundError, ValueError):
        return None  # not there yet, or a rewrite caught mid-way: the next event brings it
    if isinstance(data, dict) and data.get("status") not in ("pending", None):
        return data  # terminal (a status we do not know counts as terminal, not applied)
    return None


def _decision(result: Mapping[str, Any], request: Request, ref: str) -> Decision:
    status = str(result.get("status"))
    reason = str(result.get("reason") or status)
    by = result.get("decided_by")
    by = str(by) if by is not None else None
    if status == "applied" and result.get("request_sha256") != request.sha256:
        return Decision(
            False,
            "denied: the request the broker decided on is not the one filed for this code "
            "(the outbox file was replaced); nothing runs",
            "denied",
            ref,
            by,
        )
    return Decision(status == "applied", reason, status, ref, by)


def withdraw(config: Config, paths: sandbox.SandboxPaths, request_id: str) -> None:
    """Take the request back as an agent does: its file, if no broker has read it yet,
    else a withdrawal (protocol version 2), which the broker turns into a denial while the
    request still waits (recorded in the ledger and the audit log, by "agent"), and
    ignores once it is approved or decided. `config` is the host's (unused: kept for
    callers)."""
    try:
        os.unlink(paths.outbox / f"{request_id}.json")
        log.warning("withdrew request %s before any broker read it", request_id)
        return
    except FileNotFoundError:
        pass
    body = {"version": PROTOCOL_VERSION, "id": request_id, "reason": WITHDRAWN}
    tmp = paths.outbox / f".{request_id}.withdraw.tmp"
    try:
        tmp.write_bytes(json.dumps(body).encode("utf-8"))
        os.rename(tmp, paths.outbox / f"{request_id}.withdraw")
    except OSError as exc:
        log.warning("could not withdraw %s/%s: %s", paths.sandbox_id, request_id, exc)
