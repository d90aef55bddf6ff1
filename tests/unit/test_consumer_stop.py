"""Leaving `read_committed` (app/kafka/admin.py) waits a bounded time for its consumer's
stop: a TLS close that uvloop holds for its 30 s shutdown timeout goes on in the
background, and a stop that fails is logged, not raised."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from app.kafka import admin as kafka_admin


class SlowStop:
    """A consumer whose stop ends when `closed` is set."""

    def __init__(self) -> None:
        self.closed = asyncio.Event()
        self.stopped = False

    async def stop(self) -> None:
        await self.closed.wait()
        self.stopped = True


class FailingStop:
    async def stop(self) -> None:
        raise OSError("connection reset")


async def test_a_stop_past_the_wait_goes_on_in_the_background(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kafka_admin, "STOP_WAIT_SECONDS", 0.01)
    consumer = SlowStop()
    await kafka_admin._stop_in_background(consumer)  # type: ignore[arg-type]
    assert not consumer.stopped and len(kafka_admin._stops_under_way) == 1
    consumer.closed.set()
    (stop,) = kafka_admin._stops_under_way
    await stop  # its done callback, added before this await's, has run
    assert consumer.stopped and kafka_admin._stops_under_way == set()


async def test_a_failed_stop_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    consumer: Any = FailingStop()
    with caplog.at_level(logging.WARNING, logger=kafka_admin.__name__):
        await kafka_admin._stop_in_background(consumer)
    assert "connection reset" in caplog.text
    assert kafka_admin._stops_under_way == set()
