"""Where requests, decisions and the audit queue live: one interface (`Store`, in
base.py), two implementations.

    base.py        the Store protocol every part of the broker is written against
    queries.py     the SQL both back ends run, once, with their dialects' differences
    operations.py  the operations both run the same way (statements in, records out)
    sqlite.py      the embedded default: SQLite in the state dir, one broker
                   (sqlite_schema.py its tables)
    postgres.py    PostgreSQL shared by a fleet of brokers (psycopg 3 and its pool):
                   pg_session.py its connections, transactions and round trips,
                   pg_schema.py its tables and errors
    leases.py      each broker's lease on its host id in PostgreSQL
    listen.py      LISTEN/NOTIFY: others' decisions reach the owning broker as they commit
    audit_copy.py  a broker's local copy of its host's audit chain in PostgreSQL
    factory.py     `open_store(config)`: the one the configuration names

Moving a SQLite ledger into PostgreSQL is broker.hosting.migrate (it takes the state
dir's lock first).
"""

from __future__ import annotations

from broker.store.base import IN_FLIGHT, WAITING, Store

__all__ = ["IN_FLIGHT", "WAITING", "Store"]
