"""People deciding: decisions and quorum (`decisions`), the card a person sees
(`card`), and who is told that a request waits (`notify`: the terminal, webhooks,
Slack).

May import: everything below broker.loop except broker.review, and broker.slack (a
channel the notifier sends through)."""
