"""The exactly-once core: partition tasks, steps, the outbox, the commit of each
partition's transaction, local table state, and the one module of faust/aiokafka
internals (`internals`). Agents use it; it knows nothing of pairing."""
