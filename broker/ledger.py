"""The embedded ledger under its first name: `broker.ledger.Ledger` is the SQLite store
(`broker.store.sqlite`). New code takes a `broker.store.Store` from `open_store`."""

from __future__ import annotations

from broker.models import Decision, Record
from broker.store.base import IN_FLIGHT, WAITING
from broker.store.sqlite import SCHEMA, Ledger, SQLiteStore

__all__ = ["IN_FLIGHT", "SCHEMA", "WAITING", "Decision", "Ledger", "Record", "SQLiteStore"]
