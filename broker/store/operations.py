"""The Store operations both back ends run the same way: the statements of queries.py,
rows in, records out, one data path for SQLite and PostgreSQL.

A back end gives `SqlOperations` its dialect and four things of its own: `_fetch` (a
statement's rows as dicts), `_write` (a statement whose answer nobody reads: SQLite runs
it at once, PostgreSQL may queue it), `_insert_row` (how a new row gets its seq) and
`transaction`. Its hooks say what sharing adds: `_owned_host` (an owner's host filter),
`_locking` (reads inside a transaction lock their rows), `_clean` (values as its text
can hold them), `_changed` (a request was written: NOTIFY its host), `_lock_controls`
and `_controls_changed` (every broker obeys the controls).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar

from broker import codec
from broker.errors import AmbiguousRequest, RequestNotFound
from broker.models import Decision, Record
from broker.store import queries as q
from broker.store.base import JSON_COLUMNS, record_from, record_values

MIN_PREFIX = 4  # shorter than this, a prefix is a typo more often than a name

__all__ = ["SqlOperations"]

Row = dict[str, Any]


class SqlOperations:
    """The shared half of SQLiteStore and PostgresStore (see the module doc)."""

    dialect: ClassVar[q.Dialect]

    # -- what each back end provides --------------------------------------------------

    def transaction(self) -> AbstractContextManager[None]:
        raise NotImplementedError

    def _fetch(self, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        raise NotImplementedError

    def _write(self, sql: str, args: Sequence[Any] = ()) -> None:
        raise NotImplementedError

    def _insert_row(self, record: Record, data: dict[str, Any]) -> int:
        """Write a new request's columns; its seq."""
        raise NotImplementedError

    def _owned_host(self) -> str | None:
        return None

    def _locking(self) -> bool:
        return False

    def _clean(self, values: Iterable[Any]) -> list[Any]:
        return list(values)

    def _changed(self, sandbox: str, key: tuple[str, str] | None = None) -> None:
        """A request of `sandbox` (`key`, when one row) was written in this transaction."""

    def _lock_controls(self) -> None:
        """Inside a transaction: changes to the controls take turns from here."""

    def _controls_changed(self) -> None:
        """Inside a transaction: the controls changed."""

    # -- statements -------------------------------------------------------------------

    def _query(self, template: str, args: Sequence[Any] = (), lock: bool = False) -> list[Row]:
        return self._fetch(self.dialect.sql(template, lock), args)

    def _records(self, template: str, args: Sequence[Any] = (), lock: bool = False) -> list[Record]:
        return [record_from(r) for r in self._query(template, args, lock)]

    def _run(self, template: str, args: Sequence[Any] = ()) -> None:
        self._write(self.dialect.sql(template), self._clean(args))

    # -- requests ---------------------------------------------------------------------

    def insert(self, record: Record) -> Record:
        with self.transaction():
            seq = self._insert_row(record, record_values(record))
            self._changed(record.sandbox, record.key)
        return record.evolve(seq=seq)

    def update(self, record: Record, **changes: Any) -> Record:
        """Write `changes` to the row and return the new record; unsynces its result."""
        new = record.evolve(**changes)
        values = [
            codec.dumps(v) if k in JSON_COLUMNS and v is not None else v for k, v in changes.items()
        ]
        with self.transaction():
            self._run(q.update(changes), [*values, record.sandbox, record.id])
            self._changed(record.sandbox, record.key)
        return new

    def get(self, sandbox: str, request_id: str) -> Record | None:
        found = self._records(q.GET, (sandbox, request_id), self._locking())
        return found[0] if found else None

    def find(self, ref: str) -> Record:
        """A request by `ID` (unambiguous across sandboxes) or `SANDBOX/ID`; either may be
        a unique prefix of the id, at least MIN_PREFIX characters (as git's short hashes)."""
        sandbox, _, request_id = ref.partition("/") if "/" in ref else ("", "", ref)
        if sandbox:
            record = self.get(sandbox, request_id)
            if record is not None:
                return record
        else:
            found = self._records(q.BY_ID, (ref,), self._locking())
            if len(found) > 1:
                where = ", ".join(f"{r.sandbox}/{ref}" for r in found)
                raise AmbiguousRequest(
                    f"id {ref!r} exists in several sandboxes: use one of {where}"
                )
            if found:
                return found[0]
        return self._by_prefix(sandbox, request_id)

    def _by_prefix(self, sandbox: str, prefix: str) -> Record:
        where = f" in sandbox {sandbox!r}" if sandbox else ""
        found: list[Record] = []
        if len(prefix) >= MIN_PREFIX:
            found = [
                r
                for r in self._records(q.BY_PREFIX, (prefix, prefix))
                if not sandbox or r.sandbox == sandbox
            ]
        if not found:
            raise RequestNotFound(f"no request with id {prefix!r}{where}")
        if len(found) > 1:
            names = ", ".join(f"{r.sandbox}/{r.id}" for r in found[:10])
            raise AmbiguousRequest(f"{prefix!r} begins several ids{where}: use one of {names}")
        return self.get(*found[0].key) or found[0]  # read again under the row's lock

    def by_idempotency_key(self, sandbox: str, key: str) -> Record | None:
        """The first request with this key (a staged one only when no other has it)."""
        found = self._records(q.BY_KEY, (sandbox, key))
        return found[0] if found else None

    def replays_of(self, record: Record) -> list[Record]:
        """The replays still waiting on `record`, in arrival order."""
        return self._records(q.REPLAYS, (record.sandbox, record.id))

    def in_states(self, states: Iterable[str]) -> list[Record]:
        return self._records(*q.in_states(self.dialect, self._owned_host(), list(states)))

    def count_waiting(self, sandbox: str) -> int:
        return int(self._query(q.COUNT_WAITING, (sandbox,))[0]["n"])

    def answered_ids(self, sandbox: str) -> list[str]:
        """Ids of a sandbox's requests that have a result file to show, oldest first."""
        return [str(r["id"]) for r in self._query(q.ANSWERED, (sandbox,))]

    def counts(self, sandbox: str) -> dict[str, int]:
        """Requests of one sandbox by state."""
        return {str(r["state"]): int(r["n"]) for r in self._query(q.COUNTS, (sandbox,))}

    def recent(self, limit: int = 50) -> list[Record]:
        return self._records(q.RECENT, (limit,))

    def search(
        self,
        *,
        effect: str | None = None,
        sandbox: str | None = None,
        states: Iterable[str] | None = None,
        limit: int = 50,
    ) -> list[Record]:
        """The newest requests matching every filter given (read-only; the web inbox)."""
        wanted = None if states is None else list(states)
        return self._records(*q.search(self.dialect, effect, sandbox, wanted, limit))

    def all(self) -> list[Record]:
        return self._records(q.ALL)

    def unsynced(self) -> list[Record]:
        return self._records(*q.unsynced(self._owned_host()))

    def mark_synced(self, written: Iterable[tuple[str, str, str]]) -> None:
        """Note results written as (sandbox, id, state); a newer state stays unsynced."""
        with self.transaction():
            for row in written:
                self._run(q.MARK_SYNCED, row)

    def history(self, sandbox: str) -> list[Record]:
        """A sandbox's requests that reached the policy (no `invalid`, no replays),
        oldest first: what quotas and history conditions count."""
        return self._records(q.HISTORY, (sandbox,))

    # -- decisions --------------------------------------------------------------------

    def add_decision(self, decision: Decision) -> None:
        d = decision
        with self.transaction():
            self._run(
                q.ADD_DECISION,
                (d.sandbox, d.id, d.approver, d.verdict, d.reason, d.surface, d.sha256, d.at),
            )
            self._changed(d.sandbox)

    def decisions(self, sandbox: str, request_id: str) -> list[Decision]:
        return [Decision(**r) for r in self._query(q.DECISIONS, (sandbox, request_id))]

    def all_decisions(self) -> list[Decision]:
        return [Decision(**r) for r in self._query(q.ALL_DECISIONS)]

    # -- controls ---------------------------------------------------------------------

    def controls(self, kind: str) -> dict[str, dict[str, Any]]:
        """Every entry of one kind of control, by key (in key order)."""
        return {str(r["key"]): codec.loads(r["value"]) for r in self._query(q.CONTROLS, (kind,))}

    def put_control(self, kind: str, key: str, value: Mapping[str, Any] | None) -> None:
        """Set (None: remove) one entry and bump `policy_generation`, in the current
        transaction."""
        with self.transaction():
            self._lock_controls()
            if value is None:
                self._run(q.DROP_CONTROL, (kind, key))
            else:
                self._run(q.PUT_CONTROL, (kind, key, codec.dumps(dict(value))))
            self._run(q.BUMP_GENERATION)
            self._controls_changed()

    def next_control_key(self, kind: str) -> str:
        """The next free number among one kind's keys (inside a transaction)."""
        with self.transaction():
            self._lock_controls()
            rows = self._query(q.NEXT_CONTROL, (kind,))
        return str((rows[0]["n"] or 0) + 1)

    def policy_generation(self) -> int:
        rows = self._query(q.GENERATION)
        return int(rows[0]["value"]) if rows else 0
