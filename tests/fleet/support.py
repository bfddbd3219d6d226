"""Brokers of a fleet as real processes: each "host" has its own state dir, outbox and
results (attach mode, sandbox `default`, so two hosts' sandboxes share a local name),
one shared PostgreSQL (the session's real server), and the crash suite's receiver."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.audit import log as audit
from broker.models import TERMINAL, Record
from broker.store.postgres import PostgresStore
from broker.web.auth import hash_token
from tests.crash.support import BrokerProcess, Site, broker_env, wait_for, write_atomically
from tests.pgserver import PASSWORD, free_port

TOKENS = {"alice": "bkr_fleet-alice-token", "bob": "bkr_fleet-bob-token"}


def request(rid: str, effect: str = "crashtest.send", **extra: Any) -> dict[str, Any]:
    return {"version": 1, "id": rid, "effect": effect, "params": {"value": rid}, **extra}


@dataclass
class Host:
    """One broker host of the fleet: `name` is its host id."""

    root: Path
    name: str
    url: str
    receiver_url: str
    policy: str = ""
    listen: bool = False
    pythonpath: str = ""
    port: int = 0
    site: Site = field(init=False)
    process: BrokerProcess | None = None

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        secret = self.root / "pgpass"
        secret.write_text(PASSWORD + "\n", encoding="utf-8")
        approvers = "".join(
            f'[approvers.{who}]\ntoken_sha256 = "{hash_token(token)}"\n'
            for who, token in TOKENS.items()
        )
        extra = (
            f'ledger = "{self.url}"\nledger_password_file = "{secret}"\n'
            f'host_id = "{self.name}"\nallow_as = true\n{approvers}'
        )
        self.site = Site(
            self.root,
            self.receiver_url,
            self.policy,
            broker_extra=extra,
            pythonpath=self.pythonpath,
        )
        self.pythonpath = self.site.pythonpath
        self.port = free_port() if self.listen else 0

    @property
    def sandbox(self) -> str:
        return f"{self.name}.default"

    def args(self) -> list[str]:
        args = self.site.serve_args()
        if self.listen:
            args += ["--listen", f"127.0.0.1:{self.port}"]
        return args

    def start(self, log_name: str = "broker.log") -> BrokerProcess:
        self.process = BrokerProcess.start(
            self.args(), broker_env(self.pythonpath), self.root / log_name
        )
        wait_for(
            lambda: "serving" in self.process.output() or self.process.proc.poll() is not None,
            60,
            f"broker {self.name} to start",
        )
        assert self.process.proc.poll() is None, self.process.output()
        return self.process

    def serve_once(self) -> subprocess.CompletedProcess[str]:
        """`broker serve` in the foreground, for one that should refuse to start."""
        return subprocess.run(
            self.args(),
            capture_output=True,
            text=True,
            timeout=60,
            env=broker_env(self.pythonpath),
        )

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process = None

    def write(self, doc: dict[str, Any]) -> None:
        write_atomically(self.site.outbox, f"{doc['id']}.json", doc)

    def stage(self, docs: list[dict[str, Any]]) -> None:
        """Write many requests at once (temp files first, then renames)."""
        for doc in docs:
            (self.site.outbox / f".{doc['id']}.tmp").write_text(json.dumps(doc))
        for doc in docs:
            os.rename(
                self.site.outbox / f".{doc['id']}.tmp", self.site.outbox / f"{doc['id']}.json"
            )

    def results(self) -> dict[str, dict[str, Any]]:
        return self.site.results_now()

    def result(
        self, rid: str, statuses: tuple[str, ...] = tuple(TERMINAL), timeout: float = 60
    ) -> dict[str, Any]:
        wait_for(
            lambda: self.results().get(rid, {}).get("status") in statuses,
            timeout,
            f"{self.name}/{rid} to be {'|'.join(statuses)}",
        )
        return self.results()[rid]

    def answered(self, count: int, timeout: float = 180) -> dict[str, dict[str, Any]]:
        wait_for(
            lambda: sum(r.get("status") in TERMINAL for r in self.results().values()) >= count,
            timeout,
            f"{count} terminal results on {self.name}",
        )
        return self.results()

    def cli(self, *args: str) -> Any:
        return self.site.cli(*args)


@contextmanager
def store(url: str, host: str = "tests") -> Iterator[PostgresStore]:
    opened = PostgresStore(url, password=PASSWORD, host=host, owner=False, chain=audit.chain)
    try:
        yield opened
    finally:
        opened.close()


def rows(url: str) -> list[Record]:
    with store(url) as s:
        return s.all()
