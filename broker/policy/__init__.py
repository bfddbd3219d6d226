"""The policy: from a canonical request to a verdict (auto, approve, deny).

`rules` (one rule and its parsing), `ruleset` (the ordered rules of broker.toml),
`quotas` ([[limits]]), `history` (what a sandbox did before), `controls` (kill
switches and accepted remembered rules, in the store), `check` (rules against the
registered effects), and `verdict`, the one function every caller asks.

May import: the kernel and broker.store."""
