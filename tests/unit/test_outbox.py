"""Where a step's records go: the transaction of its source partition, or, with the
benchmark switch that turns transactions off, the app's plain producer."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from faust.types import TP

from app.outbox import DeliveryFailed, Record, send_in_transaction

RECORDS: list[Record] = [("pairs", b"k", b"v", None), ("events-by-timestamp", b"k2", b"w", 3)]


class PlainProducer:
    def __init__(self) -> None:
        self.sent: list[Record] = []

    async def send(
        self, topic: str, key: bytes | None, value: bytes | None, partition: int | None,
        timestamp: float | None, headers: Any,
    ) -> asyncio.Future[None]:  # fmt: skip
        self.sent.append((topic, key, value, partition))
        delivery: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        delivery.set_result(None)
        return delivery


def fake_app(in_transaction: bool) -> Any:
    return SimpleNamespace(
        in_transaction=in_transaction,
        producer=PlainProducer(),
        conf=SimpleNamespace(id="bench-app"),
    )


async def test_without_transactions_records_go_through_the_plain_producer() -> None:
    app = fake_app(in_transaction=False)
    deliveries = await send_in_transaction(app, TP("events", 2), RECORDS)
    assert app.producer.sent == RECORDS
    assert len(deliveries) == 2 and all(d.done() for d in deliveries)


async def test_with_transactions_a_missing_transaction_stops_the_step() -> None:
    app = fake_app(in_transaction=True)
    with pytest.raises(DeliveryFailed, match="bench-app-events-2"):
        await send_in_transaction(app, TP("events", 2), RECORDS)
    assert app.producer.sent == []  # nothing went around the transaction
