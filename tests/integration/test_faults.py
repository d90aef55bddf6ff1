"""kill -9 while events flow: no output may be lost or appear twice."""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

import pytest

from tests.integration.harness import Pipeline, compare, expected_total, wait_for_outputs
from tools.generate import StreamShape, generate
from tools.read_outputs import OutputReader

pytestmark = [pytest.mark.broker, pytest.mark.fault]

EVENTS = int(os.environ.get("PAIRSTREAM_FAULT_EVENTS", "50000"))
SEED = int(os.environ.get("PAIRSTREAM_FAULT_SEED", random.randrange(1 << 30)))


async def test_worker_killed_three_times_outputs_each_result_once(
    broker: str, tmp_path: Path
) -> None:
    print(f"fault test seed {SEED}, {EVENTS} events")
    rng = random.Random(SEED)
    records = generate(StreamShape(count=EVENTS, seed=SEED))
    pipeline = await Pipeline(broker, tmp_path).create_topics()
    expected = pipeline.expected(records)
    total = expected_total(expected)
    kill_at = sorted(rng.uniform(0.1, 0.8) for _ in range(3))

    worker = pipeline.worker().start()
    await worker.wait_ready()
    producing = asyncio.create_task(pipeline.produce(records, rate=EVENTS / 40))
    try:
        async with OutputReader(pipeline.conf) as reader:
            for fraction in kill_at:
                await wait_for_outputs(reader, int(fraction * total), timeout=300)
                # Land the kill anywhere in the commit cycle, not just after a read.
                await asyncio.sleep(rng.uniform(0, pipeline.conf.commit_interval_seconds))
                assert worker.process is not None and worker.process.poll() is None, worker.log()
                print(f"kill -9 after {reader.total}/{total} outputs")
                worker.kill()
                worker.start()
            await producing
            await wait_for_outputs(reader, total, timeout=600)
            worker.stop()
            outputs = await reader.read_available()
    finally:
        producing.cancel()
        worker.kill()
    problems = compare(outputs, expected)
    assert problems == {}, f"seed {SEED}: {problems}"
