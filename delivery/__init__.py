"""Once-only delivery of pairs to a third-party HTTP API: the rules (`rules`), the
store of what was delivered (`store`), the HTTP client (`client`), the dispatcher
that calls it (`dispatcher`) and the agent that feeds it (`agent`). docs/delivery.md."""
