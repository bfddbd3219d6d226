"""Running the broker on a host: Docker sandboxes (`sandbox`), `broker run`
(`runner`), serving a sandbox beside or as the owner (`serving`), and moving a SQLite
ledger to PostgreSQL (`migrate`).

May import: every layer below it; not the surfaces (cli, web, integrations)."""
