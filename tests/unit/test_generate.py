"""The test input's producer keeps going through a broker bounce."""

from __future__ import annotations

import pytest
from aiokafka.errors import KafkaTimeoutError

from tools.generate import send_through_outage


class FlakyProducer:
    """Refuses the first `refusals` sends as aiokafka does while a broker is away."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.taken: list[tuple[str, bytes | None, bytes | None]] = []

    async def send(self, topic: str, value: bytes | None, key: bytes | None = None) -> None:
        if self.refusals:
            self.refusals -= 1
            raise KafkaTimeoutError()
        self.taken.append((topic, key, value))


async def test_a_record_refused_during_an_outage_is_sent_again_once() -> None:
    producer = FlakyProducer(refusals=2)
    await send_through_outage(producer, "events", b"k", b"v", tries=3)
    assert producer.taken == [("events", b"k", b"v")]


async def test_an_outage_longer_than_every_try_fails_the_producer() -> None:
    producer = FlakyProducer(refusals=3)
    with pytest.raises(KafkaTimeoutError):
        await send_through_outage(producer, "events", b"k", b"v", tries=3)
    assert producer.taken == []
