"""Sandboxes other processes hand to the owner of the state dir (`broker run` beside a
running broker): serve one on request, tell its client when a request of it starts
waiting, and answer `release` once what it left in its outbox has been processed."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker import fleet
from broker.errors import ConfigError
from broker.events import Control
from broker.intake.outbox import Served, from_layout
from broker.models import Record
from broker.names import Kind, classify

log = logging.getLogger("broker")
SANDBOX_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
RELEASE_TIMEOUT_S = 60.0


@dataclass
class _Release:
    reply: Callable[[dict[str, Any]], None]
    deadline: float


class Handover:
    """The owner's side of handed-in sandboxes; called on the broker's loop."""

    def __init__(self, served: Served, sandboxes_dir: Path) -> None:
        self.served = served
        self.sandboxes_dir = sandboxes_dir
        self._followers: dict[str, list[Any]] = {}  # sandbox -> connections
        self._releasing: dict[str, _Release] = {}
        self._handed: set[str] = set()

    def control(self, item: Control, now: float, on_new: Callable[[str], None]) -> None:
        """Serve or release a sandbox for a client (which names it by its local id);
        `on_new` rescans a new one."""
        if item.op == "serve":
            self._serve(item, on_new)
        elif item.op == "release":
            sandbox = self.served.qualify(item.sandbox)
            self._releasing[sandbox] = _Release(item.reply, now + RELEASE_TIMEOUT_S)

    def _serve(self, item: Control, on_new: Callable[[str], None]) -> None:
        if not SANDBOX_ID.fullmatch(item.sandbox):
            item.reply({"ok": False, "error": f"{item.sandbox!r} is not a sandbox id"})
            return
        sandbox = self.served.qualify(item.sandbox)
        if sandbox not in self.served.boxes:
            try:
                self.served.add(from_layout(self.sandboxes_dir, item.sandbox))
            except ConfigError as exc:
                item.reply({"ok": False, "error": str(exc)})
                return
            self._handed.add(sandbox)
            log.info("serving sandbox %s for another process (broker run)", sandbox)
            on_new(sandbox)
        if item.connection is not None:
            self._followers.setdefault(sandbox, []).append(item.connection)
        item.reply({"ok": True})

    def tell(self, record: Record) -> None:
        """An observer of results: a client hears when its request starts waiting."""
        if record.state != "pending":
            return
        followers = self._followers.get(record.sandbox)
        if not followers:
            return
        for conn in followers:
            conn.send({"event": "pending", "id": record.id})
        followers[:] = [c for c in followers if not c.closed]

    def releases(self, busy: Callable[[str], bool], now: float) -> list[str]:
        """Answer the releases whose sandbox has nothing left to process; return them."""
        done = []
        for sandbox, release in list(self._releasing.items()):
            if busy(sandbox) and now < release.deadline:
                continue
            del self._releasing[sandbox]
            release.reply({"ok": True, "released": True})
            self._followers.pop(sandbox, None)
            if sandbox in self._handed:  # under a served root it would come back anyway
                self._handed.discard(sandbox)
                name = fleet.local(self.served.host, sandbox)
                if not any(name in self._listed(root) for root in self.served.roots):
                    self.served.remove(sandbox)
            done.append(sandbox)
        return done

    @staticmethod
    def _listed(root: Path) -> set[str]:
        try:
            return {p.name for p in root.iterdir()}
        except OSError:
            return set()


def has_requests(names: list[str]) -> bool:
    """Whether an outbox listing still holds request files to read."""
    return any(classify(n)[0] is Kind.REQUEST for n in names)
