"""The audit log: the keyed, hash-chained file of every request, decision and outcome
(`log`), and what proves it off the state dir: the key and signed checkpoints
(`checkpoints`).

May import: the kernel (broker/*.py) only. The store drains its queued events into the
log (broker.store.audit_writer); the log knows nothing of the store."""
