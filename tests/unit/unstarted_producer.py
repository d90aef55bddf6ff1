"""An aiokafka producer that is never started, whose metadata knows some topics: enough
for its partitioner and its accumulator, with no broker."""

from __future__ import annotations

from aiokafka import AIOKafkaProducer
from aiokafka.protocol.metadata import MetadataResponse_v0


def producer_knowing(
    topics: dict[str, int], transactional_id: str | None = None
) -> AIOKafkaProducer:
    """`topics`: topic -> number of partitions."""
    producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:1", transactional_id=transactional_id)
    known = [(0, t, [(0, p, 0, [0], [0]) for p in range(n)]) for t, n in topics.items()]
    producer.client.cluster.update_metadata(
        MetadataResponse_v0(brokers=[(0, "127.0.0.1", 1)], topics=known)
    )
    return producer
