"""The real pipeline against the real broker, checked against the reference model."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.integration.harness import Pipeline, compare, expected_total, wait_for_outputs
from tools.generate import INVALID_RECORDS, StreamShape, generate
from tools.read_outputs import OutputReader

pytestmark = pytest.mark.broker


async def run_to_completion(pipeline: Pipeline, records: list[bytes | None]) -> None:
    expected = pipeline.expected(records)
    worker = pipeline.worker().start()
    try:
        await worker.wait_ready()
        await pipeline.produce(records)
        async with OutputReader(pipeline.conf) as reader:
            await wait_for_outputs(reader, expected_total(expected), timeout=180)
            worker.stop()  # nothing more can commit after this
            outputs = await reader.read_available()
    finally:
        worker.kill()
    assert compare(outputs, expected) == {}
    assert expected.pending  # the stream leaves some events waiting: a real check


async def test_generated_stream_matches_reference_model(broker: str, tmp_path: Path) -> None:
    records = generate(StreamShape(count=4000, seed=11))
    await run_to_completion(await Pipeline(broker, tmp_path).create_topics(), records)


async def test_every_kind_of_bad_input_is_dead_lettered_and_neighbours_processed(
    broker: str, tmp_path: Path
) -> None:
    good = generate(StreamShape(count=400, seed=5, invalid=0.0))
    oversize = b'{"type":"A","timestamp":"2024-02-09 21:00:00","value":1,"pad":"%s"}' % (
        b"x" * 70_000
    )
    bad: list[bytes | None] = [*INVALID_RECORDS, oversize]
    records: list[bytes | None] = []
    for i, raw in enumerate(good):
        records.append(raw)
        if i % 20 == 0 and bad:
            records.append(bad.pop())
    assert not bad
    pipeline = await Pipeline(broker, tmp_path).create_topics()
    await run_to_completion(pipeline, records)
    async with OutputReader(pipeline.conf) as reader:
        outputs = await reader.read_available()
    reasons = [d["reason"] for d in outputs.dead_letters if not d["reason"].startswith("conflict")]
    assert len(reasons) == len(INVALID_RECORDS) + 1
    assert all(reasons), reasons
    binary = [d for d in outputs.dead_letters if "value_base64" in d]
    assert len(binary) == 1  # the non-UTF-8 record kept its bytes


async def test_quiet_stream_still_drains_by_max_wait(broker: str, tmp_path: Path) -> None:
    pipeline = await Pipeline(
        broker,
        tmp_path,
        PAIRSTREAM_MAX_WAIT_SECONDS="2",
        PAIRSTREAM_TICK_INTERVAL_SECONDS="0.5",
    ).create_topics()
    lonely = b'{"type":"A","timestamp":"2024-02-09 21:00:00","value":1,"id":"lonely"}'
    worker = pipeline.worker().start()
    try:
        await worker.wait_ready()
        await pipeline.produce([lonely])
        async with OutputReader(pipeline.conf) as reader:
            outputs = await wait_for_outputs(reader, 1, timeout=120)
    finally:
        worker.kill()
    # Stream time never moved past the event: only the wall clock can expire it.
    assert outputs.unpaired == [
        {
            "timestamp": "2024-02-09T21:00:00Z",
            "type": "A",
            "value": 1,
            "id": "lonely",
            "reason": "expired",
        }
    ]


@pytest.mark.parametrize("lose_data_dir", [False, True], ids=["local-rocksdb", "changelog-only"])
async def test_state_survives_a_restart(broker: str, tmp_path: Path, lose_data_dir: bool) -> None:
    """Half the stream, a clean stop, then the rest: pending events of the first
    half must pair with partners in the second, from local RocksDB or, with the
    data dir gone, from the changelog alone."""
    records = generate(StreamShape(count=3000, seed=21))
    pipeline = await Pipeline(broker, tmp_path).create_topics()
    first, second = records[:1500], records[1500:]
    expected_first = pipeline.expected(first)
    expected = pipeline.expected(records)
    worker = pipeline.worker()
    try:
        async with OutputReader(pipeline.conf) as reader:
            worker.start()
            await worker.wait_ready()
            await pipeline.produce(first)
            await wait_for_outputs(reader, expected_total(expected_first), timeout=180)
            worker.stop()
            assert (worker.data_dir / "clean-shutdown").exists()
            if lose_data_dir:
                shutil.rmtree(worker.data_dir)
            worker.start()
            await worker.wait_ready()
            assert "discarding" not in worker.log()  # a clean stop keeps local state
            await pipeline.produce(second)
            await wait_for_outputs(reader, expected_total(expected), timeout=180)
            worker.stop()
            outputs = await reader.read_available()
    finally:
        worker.kill()
    assert expected_first.pending  # some events wait across the restart
    assert compare(outputs, expected) == {}
