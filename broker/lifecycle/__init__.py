"""A request's life inside one wake-up: from a read request to its first state
(`admission`), the off-loop assessments (`assessing`), the state machine (`transitions`),
applying (`apply`, `marks`), what the wake-up does after its commit (`batch`), result
files (`results`), undo (`undo`), and admission's stage times (`timings`).

May import: the kernel, broker.audit, broker.store, broker.intake, broker.policy."""
