"""A port for a worker's web server, in the tests and the benchmarks."""

from __future__ import annotations

import random
import socket

# Below Linux's ephemeral range (32768-60999): a port from there (what a bind to port 0
# gives) can be taken by the local end of any outgoing connection, a Kafka client's,
# between the check and the worker's own bind. The smoke run's side-by-side parts lost
# a worker that way ("address already in use").
PORTS = range(20_000, 32_000)

# Ports this process has handed out: a port is free until its taker binds it, so two
# callers before either bind (the smoke run's side-by-side parts: a worker, PostgreSQL,
# Connect) could be given the same one.
_GIVEN: set[int] = set()


def free_port() -> int:
    """A port nothing is bound to now, outside the ephemeral range, and not given to
    another caller in this process."""
    for _ in range(100):
        port = random.choice(PORTS)
        if port in _GIVEN:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("0.0.0.0", port))  # as the worker binds: every address
            except OSError:
                continue
            _GIVEN.add(port)
            return port
    raise RuntimeError(f"no free port in {PORTS}")
