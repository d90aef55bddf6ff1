from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import pytest

from tools import broker as local_broker

BROKER_PORT = int(os.environ.get("PAIRSTREAM_TEST_BROKER_PORT", "9092"))


@pytest.fixture(scope="session")
def broker() -> Iterator[str]:
    """A real Kafka broker: the running local one, or one started for this session."""
    # Its own data dir per port, so test sessions on different ports can run side by side.
    name = "kafka" if BROKER_PORT == 9092 else f"kafka-{BROKER_PORT}"
    nodes = local_broker.cluster(1, BROKER_PORT, name)
    started = False
    if not asyncio.run(local_broker._cluster_answers(nodes)):
        local_broker.start(nodes, timeout=120)
        started = True
    yield local_broker.bootstrap_servers(nodes)
    if started:
        local_broker.stop(nodes, hard=False)
