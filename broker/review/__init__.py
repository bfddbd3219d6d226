"""Looking back and ahead at policy: what the broker would decide for a request file
(`explain`), every past request through a new policy (`replay`), the narrowest rule
for an approved request (`drafting`), and proposals people accept as rules
(`proposals`).

May import: the kernel, broker.store, broker.intake, broker.policy, broker.lifecycle."""
