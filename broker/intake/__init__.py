"""What comes out of a sandbox: the served outboxes and their watcher (`outbox`,
`inotify`), the claim and the safe read of each file (`claims`), strict JSON
(`strict_json`), and the handler's canonical params (`canonical`).

May import: the kernel only. Nothing here decides or writes the ledger."""
