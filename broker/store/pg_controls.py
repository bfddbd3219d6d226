"""The PostgreSQL store's controls (kill switches, proposals, remembered rules: every
broker of the fleet obeys them, so a change wakes them all) and a sandbox's history
(what quotas and history conditions count)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker import codec
from broker.models import Record
from broker.store.base import record_from
from broker.store.pg_schema import CHANNEL, EVERY_HOST
from broker.store.pg_session import Session


class Controls(Session):
    """Mixed into PostgresStore; its statements go through the session's transaction."""

    def controls(self, kind: str) -> dict[str, dict[str, Any]]:
        rows = self.execute("SELECT key, value FROM controls WHERE kind = %s", (kind,))
        return {str(r["key"]): codec.loads(r["value"]) for r in rows}

    def put_control(self, kind: str, key: str, value: Mapping[str, Any] | None) -> None:
        with self.transaction():
            self._generation()  # the row lock orders every change to the controls
            if value is None:
                self.write("DELETE FROM controls WHERE kind = %s AND key = %s", (kind, key))
            else:
                self.write(
                    "INSERT INTO controls (kind, key, value) VALUES (%s, %s, %s) "
                    "ON CONFLICT (kind, key) DO UPDATE SET value = EXCLUDED.value",
                    (kind, key, codec.dumps(dict(value))),
                )
            self.write(
                "UPDATE meta SET value = (value::bigint + 1)::text WHERE key = 'policy_generation'"
            )
            self.write("SELECT pg_notify(%s, %s)", (CHANNEL, EVERY_HOST))

    def _generation(self) -> int:
        self.write(
            "INSERT INTO meta (key, value) VALUES ('policy_generation', '0') ON CONFLICT DO NOTHING"
        )
        rows = self.execute("SELECT value FROM meta WHERE key = 'policy_generation' FOR UPDATE")
        return int(rows[0]["value"])

    def next_control_key(self, kind: str) -> str:
        with self.transaction():
            self._generation()  # two hosts numbering at once take turns
            rows = self.execute(
                "SELECT MAX(key::bigint) AS n FROM controls WHERE kind = %s", (kind,)
            )
        return str((rows[0]["n"] or 0) + 1)

    def policy_generation(self) -> int:
        rows = self.execute("SELECT value FROM meta WHERE key = 'policy_generation'")
        return int(rows[0]["value"]) if rows else 0

    def history(self, sandbox: str) -> list[Record]:
        rows = self.execute(
            "SELECT * FROM requests WHERE sandbox = %s AND replay_of IS NULL "
            "AND state <> 'invalid' ORDER BY seq",
            (sandbox,),
        )
        return [record_from(r) for r in rows]
