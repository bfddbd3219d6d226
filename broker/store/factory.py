"""The store the configuration names: `[broker] ledger = "postgresql://…"` for a fleet's
shared PostgreSQL, else the SQLite ledger in the state dir."""

from __future__ import annotations

import functools

from broker.config import Config
from broker.errors import ConfigError
from broker.store.base import Store
from broker.store.sqlite import SQLiteStore


def open_store(config: Config, *, owner: bool = False) -> Store:
    """A new connection to the configured store; `owner` for the broker that serves this
    host's sandboxes (it lists only them for recovery and answers). A PostgreSQL that
    does not answer is one LedgerError naming it."""
    if config.ledger_url is None:
        return SQLiteStore(config.ledger_path)
    try:
        from broker.store.postgres import PostgresStore
    except ImportError as exc:
        raise ConfigError(
            "broker.store.sqlite: PostgreSQL needs psycopg 3 "
            "(pip install 'sandbox-outbox-broker[postgresql]')"
        ) from exc
    from broker.audit.checkpoints import audit_settings
    from broker.audit.log import chain

    key = audit_settings(config).key  # the fleet's chains are keyed as a local log is
    return PostgresStore(
        config.ledger_url,
        password=config.ledger_password(),
        host=config.host_id(),
        owner=owner,
        chain=functools.partial(chain, key=key),
    )


def store_exists(config: Config) -> bool:
    """Whether there is a store to read (a shared one always is; SQLite once made)."""
    return config.ledger_url is not None or config.ledger_path.exists()
