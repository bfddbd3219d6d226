"""A Python API for host-side integrations: wait for, or submit, a decision.

    from broker import client
    await client.decide(ref, "approve", approver="chatbot:alice", reason="ok")
    outcome = await client.decision(ref, timeout=600)  # waits, no file polling
    assert outcome.approved and outcome.decided_by == "chatbot:alice"

`ref` is a request's id (or SANDBOX/ID). The broker is found as the CLI finds it
($BROKER_CONFIG, else $BROKER_STATE_DIR) unless `config=` or `state_dir=` names it.
`decide_sync` and `decision_sync` are the same for code that is not async. An AutoGen
`approval_func` or a chat bot uses this instead of reading result files. Waiting wakes
on the ledger's own writes (its WAL file), not on a timer.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from broker.approval.decisions import Ballot, decide_and_wake
from broker.config import Config, load_config
from broker.models import Record
from broker.store.factory import open_store

UNDECIDED = ("received", "pending")


@dataclass(frozen=True)
class DecisionInfo:
    """Where a request stands once decided: the status and who said so, and why."""

    ref: str
    status: str  # approved | applying | applied | denied | expired | invalid | failed |
    # unknown | staged (staged mode: nothing applied; `approved` is False)
    decided_by: str | None
    reason: str | None

    @property
    def approved(self) -> bool:
        return self.status in ("approved", "applying", "applied", "failed", "unknown") and (
            self.decided_by is not None
        )


def _info(record: Record) -> DecisionInfo:
    return DecisionInfo(
        f"{record.sandbox}/{record.id}", record.state, record.decided_by, record.reason
    )


def _config(config: Config | None, state_dir: Path | None) -> Config:
    return config or load_config(state_dir=state_dir)


async def decision(
    ref: str,
    *,
    timeout: float | None = None,
    config: Config | None = None,
    state_dir: Path | None = None,
) -> DecisionInfo:
    """Wait until the request is decided (by a person, the policy or its deadline)."""
    from watchfiles import awatch

    cfg = _config(config, state_dir)
    ledger = open_store(cfg)
    stop = asyncio.Event()

    def current() -> Record:
        return ledger.find(ref)

    async def wait() -> DecisionInfo:
        record = current()
        if record.state not in UNDECIDED:
            return _info(record)
        wal = {str(cfg.ledger_path) + "-wal", str(cfg.ledger_path)}
        async for _ in awatch(
            cfg.state_dir,
            watch_filter=lambda _c, path: path in wal,
            stop_event=stop,
            recursive=False,
            rust_timeout=1000,
            yield_on_timeout=True,
            debounce=20,
            step=5,
        ):
            record = current()
            if record.state not in UNDECIDED:
                return _info(record)
        raise asyncio.CancelledError

    try:
        return await asyncio.wait_for(wait(), timeout)
    finally:
        stop.set()
        ledger.close()


def decision_sync(
    ref: str,
    *,
    timeout: float | None = None,
    config: Config | None = None,
    state_dir: Path | None = None,
) -> DecisionInfo:
    """`decision`, for code that is not async (raises TimeoutError on timeout)."""
    return asyncio.run(decision(ref, timeout=timeout, config=config, state_dir=state_dir))


async def decide(
    ref: str,
    verdict: str,
    *,
    approver: str,
    reason: str | None = None,
    sha256: str | None = None,
    surface: str = "api",
    config: Config | None = None,
    state_dir: Path | None = None,
) -> DecisionInfo:
    """Record a host-side decision (approve | deny) and wake the broker."""
    ballot = Ballot(ref, verdict, approver, reason, surface, sha256)
    return await asyncio.to_thread(_decide, ballot, config, state_dir)


def decide_sync(
    ref: str,
    verdict: str,
    *,
    approver: str,
    reason: str | None = None,
    sha256: str | None = None,
    surface: str = "api",
    config: Config | None = None,
    state_dir: Path | None = None,
) -> DecisionInfo:
    """`decide`, for code that is not async."""
    ballot = Ballot(ref, verdict, approver, reason, surface, sha256)
    return _decide(ballot, config, state_dir)


def _decide(ballot: Ballot, config: Config | None, state_dir: Path | None) -> DecisionInfo:
    cfg = _config(config, state_dir)
    ledger = open_store(cfg)
    try:
        tally = decide_and_wake(cfg, ledger, ballot)
    finally:
        ledger.close()
    return _info(tally.record)
