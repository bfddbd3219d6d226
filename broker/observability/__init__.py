"""What a serving broker tells its operators, one module per signal: Prometheus
metrics (`metrics`), OpenTelemetry traces (`tracing`), `serve`'s request log
(`requestlog`), counts over the ledger (`stats`); the hooks they hang on after each
commit (`tap`) and their [metrics]/[tracing] set-up (`telemetry`).

May import: every layer below it, broker.loop included."""
