"""The serving broker: one loop over wake-ups (`pipeline`), the stages a wake-up's
transaction runs on each item (`wakeup`), files waiting their turn (`fairness`),
deadlines (`deadlines`), what a restart resumes (`recovery`), the state lock and
control socket (`ownership`), handed-in sandboxes (`handover`), a store that stopped
answering (`outage`), and the catalogue published into each sandbox (`catalogue`).

May import: every layer below it (kernel, audit, store, intake, policy, lifecycle,
slack, approval, review)."""
