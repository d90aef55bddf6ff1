"""The probes of a real worker: /ready false before its join and during a restore, true
after; /live false for a worker whose partitions have records and do not move, and no
answer at all while its event loop is blocked."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from pairing.records import CLOCK_KEY, decode_state
from tests.integration.harness import (
    Pipeline,
    Worker,
    expected_total,
    table,
    wait_for_outputs,
)
from tests.integration.stuckable import HOLD_SECONDS
from tools.generate import StreamShape, generate
from tools.read_outputs import OutputReader

pytestmark = pytest.mark.broker

STUCK_SECONDS = 4.0
ALIVE = (200, {"live": True, "judged": True, "stuck": []})
# Keys with one event each: those the watermark has not expired stay pending.
PENDING = StreamShape(count=20_000, missing=1.0, duplicates=0, conflicts=0, late=0, invalid=0)


class StuckableWorker(Worker):
    """A worker run by tests/integration/stuckable.py, which a signal makes stuck."""

    def command(self) -> list[str]:
        return [sys.executable, "-m", "tests.integration.stuckable", "-A", "app", "worker"]

    def signal(self, sig: int) -> None:
        assert self.process is not None
        os.kill(self.process.pid, sig)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.web_port}{path}"


async def probe(url: str, timeout: float = 5.0) -> tuple[int, dict[str, Any]]:
    client_timeout = aiohttp.ClientTimeout(total=timeout)
    async with (
        aiohttp.ClientSession(timeout=client_timeout) as session,
        session.get(url) as response,
    ):
        return response.status, await response.json()


async def readiness_until_ready(worker: StuckableWorker, timeout: float = 120) -> list[str]:
    """Ask /ready every 20 ms from the worker's start until it says ready; the reasons
    it gave meanwhile, in order, each once."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert worker.running, worker.log()[-3000:]
        try:
            status, body = await probe(worker.url("/ready"))
        except aiohttp.ClientConnectionError:  # the web server is not up yet
            await asyncio.sleep(0.02)
            continue
        if status == 200:
            assert body == {"ready": True, "reasons": []}
            return seen
        assert status == 503 and body["ready"] is False and body["reasons"], body
        seen += [reason for reason in body["reasons"] if reason not in seen]
        await asyncio.sleep(0.02)
    raise AssertionError(f"not ready after {timeout} s; reasons {seen}\n{worker.diagnosis()}")


async def committed_pending(pipeline: Pipeline) -> dict[str, str]:
    """Pairing key -> identity of its pending event, as the changelog holds them committed."""
    rows = await table(pipeline, "pairing-state")
    states = {key: decode_state(value) for key, value in rows.items() if key != CLOCK_KEY.decode()}
    return {key: state.pending.identity for key, state in states.items() if state.pending}


async def test_ready_only_in_the_group_with_tables_restored(broker: str, tmp_path: Path) -> None:
    pipeline = await Pipeline(broker, tmp_path).create_topics()
    await pipeline.produce(generate(PENDING))
    worker = StuckableWorker(pipeline, 0).start()
    first = await readiness_until_ready(worker)
    assert first[0] == "not in its consumer group yet", first
    expected = await pipeline.expected()
    async with OutputReader(pipeline.conf) as reader:  # the stream processed
        await wait_for_outputs(reader, expected_total(expected), timeout=120)

    # Killed, its local state lost: all there is of it is in the changelog. Of that, the
    # events pending for good (what is left to process can expire others).
    worker.kill()
    shutil.rmtree(worker.data_dir)
    committed = await committed_pending(pipeline)
    pending = {k: i for k, i in committed.items() if i in expected.pending}
    assert len(pending) > 100
    worker.start()
    again = await readiness_until_ready(worker)
    print(f"\n/ready before the first start's ready: {first}; after a loss of state: {again}")
    assert "not in its consumer group yet" in again
    assert "restoring its tables" in again, again
    # Ready means restored: every committed pending event is in the table at once.
    missing = []
    for key, identity in sorted(pending.items()):
        status, body = await probe(worker.url(f"/pending/{key}"))
        if status != 200 or body["identity"] != identity:
            missing.append((key, identity, status, body))
    assert missing == [], f"{len(missing)} of {len(pending)}: {missing[:3]}"
    worker.kill()


async def test_live_fails_for_stuck_partitions_and_a_blocked_loop(
    broker: str, tmp_path: Path
) -> None:
    pipeline = await Pipeline(
        broker, tmp_path, PAIRSTREAM_STUCK_SECONDS=str(STUCK_SECONDS)
    ).create_topics()
    await pipeline.produce(generate(StreamShape(count=2_000, seed=3)))
    worker = StuckableWorker(pipeline, 0).start()
    await readiness_until_ready(worker)
    async with OutputReader(pipeline.conf) as reader:
        await wait_for_outputs(reader, expected_total(await pipeline.expected()), timeout=120)

    # At rest, its partitions at their ends: alive, however long.
    deadline = time.monotonic() + STUCK_SECONDS + 3
    while time.monotonic() < deadline:
        assert await probe(worker.url("/live")) == ALIVE
        await asyncio.sleep(1)

    # Blocked: no answer within a probe's timeout; then alive again.
    worker.signal(signal.SIGTTIN)
    await asyncio.sleep(0.5)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await probe(worker.url("/live"), timeout=2)
    status, _ = await probe(worker.url("/live"), timeout=HOLD_SECONDS + 5)
    print(f"\n/live answered {status} {time.monotonic() - started:.1f} s into a blocked loop")
    assert status == 200

    # Paused with nothing to read: alive, however long.
    worker.signal(signal.SIGURG)
    deadline = time.monotonic() + STUCK_SECONDS + 3
    while time.monotonic() < deadline:
        assert (await probe(worker.url("/live")))[0] == 200
        await asyncio.sleep(1)

    # Paused with records to read: stuck once they have waited STUCK_SECONDS.
    await pipeline.produce(generate(StreamShape(count=200, seed=7)))
    produced = time.monotonic()
    while (answer := await probe(worker.url("/live")))[0] == 200:
        assert time.monotonic() - produced < STUCK_SECONDS + 30, answer
        await asyncio.sleep(1)
    status, body = answer
    waited = time.monotonic() - produced
    print(f"/live {status} {waited:.1f} s after records came to paused partitions: {body}")
    assert status == 503 and body["live"] is False
    inputs = f"{pipeline.conf.events_topic}["
    assert body["stuck"] and all(entry.startswith(inputs) for entry in body["stuck"]), body
    assert waited >= STUCK_SECONDS
    worker.kill()
