"""The store interface: what the broker, its recovery and every surface ask of the place
requests, decisions and the audit queue live. Two implementations: `sqlite.py` (the
embedded default, one broker per ledger) and `postgres.py` (one database shared by the
brokers of a fleet, each owning the sandboxes of its host).

Rules both keep:

- A transaction is one committed unit; nested uses join the outer one. Reads of a
  request inside a transaction (`get`, `find`) lock its row until the commit, so two
  transitions of one request never interleave (a decision and an expiry, two approvals).
- Audit events queued in a transaction commit with it, or not at all.
- A store opened for a broker (`owner` set) lists only its own host's requests in
  `in_states` and `unsynced`: only the owner of a sandbox recovers and answers it. A
  store opened for a surface (the CLI, the web inbox) sees the whole fleet.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import fields
from typing import Any, Protocol

from broker import codec
from broker.models import Decision, Record

__all__ = [
    "IN_FLIGHT",
    "JSON_COLUMNS",
    "RECORD_FIELDS",
    "WAITING",
    "AuditSink",
    "Lease",
    "Listener",
    "Store",
    "record_from",
    "record_values",
]

JSON_COLUMNS = frozenset({"errors", "output", "verdict", "preview", "seen", "facts"})
RECORD_FIELDS = [f.name for f in fields(Record)]
WAITING = ("pending",)
IN_FLIGHT = ("received", "approved", "applying")


def record_from(data: Mapping[str, Any]) -> Record:
    """A Record from a row's columns (JSON columns as text, flags as 0/1 or bool)."""
    values = {k: data[k] for k in RECORD_FIELDS if k in data}
    for key in JSON_COLUMNS:
        if values.get(key) is not None:
            values[key] = codec.loads(values[key])
    if values.get("reversible") is not None:
        values["reversible"] = bool(values["reversible"])
    return Record(**values)


def record_values(record: Record) -> dict[str, Any]:
    """A record's columns as written (JSON columns as text), `seq` left out."""
    data = {k: getattr(record, k) for k in RECORD_FIELDS if k != "seq"}
    for key in JSON_COLUMNS:
        if data[key] is not None:
            data[key] = codec.dumps(data[key])
    return data


class Lease(Protocol):
    """A broker's claim on its host id in a shared store, renewed while it lives."""

    lost: threading.Event
    """Set when another broker took the host id (this one must stop serving)."""

    def acquire(self, command: str) -> None:
        """Take the host id or raise StateBusy naming the broker that holds it."""

    def release(self) -> None:
        """Give it back (a broker that stops)."""


class Listener(Protocol):
    """Tells a broker, as they commit, of changes others made to its requests."""

    def close(self) -> None: ...


class AuditSink(Protocol):
    """The serving broker's side of the audit log (`audit.AuditWriter` for SQLite,
    `store.audit_copy.AuditCopy` for a shared store)."""

    durable: tuple[int, str] | None
    observers: list[Callable[[list[dict[str, Any]]], None]]
    """Told of the events each flush appended (broker.observability.tap)."""
    on_sync: list[Callable[[float], None]]
    """Told how long the oldest line waited for its fsync, at each sync."""

    def flush(self) -> None: ...

    def sync(self, final: bool = False) -> None: ...

    def undurable_for(self) -> float: ...

    def take_durable(self) -> tuple[int, str] | None: ...


class Store(Protocol):
    """Requests, decisions, the audit queue and its head. One per thread."""

    shared: bool
    """True when other brokers share this store (their sandboxes are host-qualified)."""

    host: str | None
    """The host id this store writes as (None for the embedded SQLite ledger)."""

    def close(self) -> None: ...

    def transaction(self) -> AbstractContextManager[None]:
        """One committed unit; nested uses join the outer one."""

    def savepoint(self) -> AbstractContextManager[None]:
        """A part of the current transaction that can fail alone."""

    def careful(self) -> AbstractContextManager[None]:
        """Within it, every statement runs at once, so a savepoint holds its own failure
        (a store that sends writes together otherwise)."""

    def ping(self) -> bool:
        """Whether the store answers now (a broker waiting out an outage asks)."""

    # -- requests ------------------------------------------------------------------

    def insert(self, record: Record) -> Record: ...

    def update(self, record: Record, **changes: Any) -> Record:
        """Write `changes` to the row and return the new record; unsynces its result."""

    def get(self, sandbox: str, request_id: str) -> Record | None: ...

    def prefetch(self, keys: Iterable[tuple[str, str]]) -> None:
        """A hint inside a transaction: these rows will be read (a round trip saved for
        each on a networked store; nothing for SQLite)."""

    def find(self, ref: str) -> Record:
        """A request by `ID` (unambiguous across sandboxes) or `SANDBOX/ID`."""

    def by_idempotency_key(self, sandbox: str, key: str) -> Record | None:
        """The first request with this key (a staged one only when no other has it)."""

    def replays_of(self, record: Record) -> list[Record]: ...

    def in_states(self, states: Iterable[str]) -> list[Record]: ...

    def count_waiting(self, sandbox: str) -> int: ...

    def answered_ids(self, sandbox: str) -> list[str]:
        """Ids of a sandbox's requests that have a result file to show."""

    def counts(self, sandbox: str) -> dict[str, int]: ...

    def recent(self, limit: int = 50) -> list[Record]: ...

    def search(
        self,
        *,
        effect: str | None = None,
        sandbox: str | None = None,
        states: Iterable[str] | None = None,
        limit: int = 50,
    ) -> list[Record]: ...

    def change_mark(self) -> int:
        """A number that grows with every committed change."""

    def all(self) -> list[Record]: ...

    def unsynced(self) -> list[Record]: ...

    def mark_synced(self, written: Iterable[tuple[str, str, str]]) -> None:
        """Note results written as (sandbox, id, state); a newer state stays unsynced."""

    # -- decisions -----------------------------------------------------------------

    def add_decision(self, decision: Decision) -> None: ...

    def decisions(self, sandbox: str, request_id: str) -> list[Decision]: ...

    def all_decisions(self) -> list[Decision]: ...

    # -- what people change on running brokers (broker.policy.controls) -------------------

    def controls(self, kind: str) -> dict[str, dict[str, Any]]:
        """Every entry of one kind of control ("switch", "rule", "proposal"), by key."""
        ...

    def put_control(self, kind: str, key: str, value: Mapping[str, Any] | None) -> None:
        """Set (None: remove) one entry and bump `policy_generation`, in the current
        transaction; a shared store wakes every broker when it commits."""

    def next_control_key(self, kind: str) -> str:
        """The next free number among one kind's keys (inside a transaction)."""
        ...

    def policy_generation(self) -> int:
        """How many times the controls changed: a running broker reloads when it moves."""
        ...

    def history(self, sandbox: str) -> list[Record]:
        """A sandbox's requests that reached the policy (no `invalid`, no replays),
        oldest first: what quotas and history conditions count."""
        ...

    # -- the audit queue -----------------------------------------------------------

    def queue_audit(self, event: dict[str, Any]) -> None:
        """Queue an event for the log, in the current transaction."""

    def audit_backlog(self, after: int = 0) -> list[tuple[int, dict[str, Any]]]: ...

    def drop_audit(self, upto: int, head: str) -> None:
        """Forget events the log holds, and remember the log's head for `verify`."""

    def audit_head(self) -> tuple[int, str] | None: ...

    def audit_keyed_from(self) -> tuple[int, str] | None:
        """The signed record (seq, mac) of the first keyed line of the state dir's log."""

    def mark_audit_keyed(self, seq: int, mac: str) -> None:
        """Record it, once (a shared store's chains live outside the state dir: no-op)."""

    def audit_sink(self, log: Any, checkpoints: Any = None, clock: Any = None) -> AuditSink:
        """What carries committed audit events into `log` (an audit.AuditLog: audit
        imports us) for a serving broker, telling `checkpoints` of each durable head;
        `clock` (a broker.clock.Clock, the real one if None) times its fsyncs."""

    # -- the fleet (a shared store; the embedded one has none of it) ---------------

    def lease(self, state_dir_key: str) -> Lease | None:
        """This host's lease, for a broker about to serve (None: nothing to share)."""

    def listen(self, on_change: Callable[[], None]) -> Listener | None:
        """Call `on_change` (from another thread) whenever others change this host's
        requests; None when nobody else can."""

    def audit_chains(self) -> dict[str, tuple[int, str]]:
        """Each chain's head in the store, by host ({} for the embedded ledger)."""

    def audit_lines(self, host: str | None = None) -> Iterator[str]:
        """Every audit line the store holds (one chain, or all), in chain order."""


Chain = Callable[[Sequence[tuple[int, dict[str, Any]]], str], tuple[list[bytes], str]]
"""The audit chain (audit.chain): events after a head → their lines and the new head."""
