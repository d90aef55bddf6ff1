"""kill -9 while 50,000 events flow: no output may be lost or appear twice."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from tests.integration.faults import kill_worker
from tests.integration.harness import Pipeline
from tests.integration.scenarios import run_scenario
from tools.generate import StreamShape, generate

# Opt-in until it passes reliably: one loss in two runs on current main (seed 5002),
# see docs/fault-matrix.md.
pytestmark = [pytest.mark.broker, pytest.mark.fault, pytest.mark.killtest]

EVENTS = int(os.environ.get("PAIRSTREAM_FAULT_EVENTS", "50000"))
SEED = int(os.environ.get("PAIRSTREAM_FAULT_SEED", random.randrange(1 << 30)))


async def test_worker_killed_three_times_outputs_each_result_once(
    broker: str, tmp_path: Path
) -> None:
    print(f"fault test seed {SEED}, {EVENTS} events")
    random.seed(SEED)
    kills = [kill_worker(random.uniform(0.1, 0.8)) for _ in range(3)]
    pipeline = await Pipeline(broker, tmp_path).create_topics()
    records = generate(StreamShape(count=EVENTS, seed=SEED))
    report = await run_scenario(pipeline, records, kills, seed=SEED, rate=EVENTS / 40)
    assert report.problems == {}, f"seed {SEED}: {report.problems}"
