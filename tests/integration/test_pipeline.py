"""The real pipeline against the real broker, checked against the reference model
computed from what each input partition holds."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import time
import zlib
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from app.kafka.admin import admin_client
from pairing.events import Event, EventType, parse_event
from pairing.records import (
    HANDED,
    TICK,
    WATERMARK_KEY,
    Source,
    decode_watermark,
    encode_keyed_event,
    encode_watermark,
)
from pairing.routing import partition_for
from pairing.watermarks import WatermarkUpdate
from tests.integration.harness import (
    Pipeline,
    Worker,
    compare,
    expected_total,
    finish,
    input_left_uncommitted,
    read_local_partition,
    read_logged,
    read_partitions,
    state_up_to,
    stop_workers,
    wait_for_outputs,
)
from tools.generate import INVALID_RECORDS, Record, StreamShape, generate
from tools.read_outputs import OutputReader, Outputs

pytestmark = pytest.mark.broker


async def run_to_completion(
    pipeline: Pipeline, records: list[Record], *, before_worker: bool = False
) -> Outputs:
    """Produce `records` (before the worker starts, or once it is ready), wait for
    every output the model predicts, and return what was committed."""
    worker = pipeline.worker()
    try:
        if before_worker:
            await pipeline.produce(records)
        worker.start()
        await worker.wait_ready()
        if not before_worker:
            await pipeline.produce(records)
        expected = await pipeline.expected()
        outputs = await finish(pipeline, [worker], expected)
    finally:
        worker.kill()
    assert compare(outputs, expected) == {}
    assert expected.pending  # the stream leaves some events waiting: a real check
    return outputs


async def test_generated_stream_matches_reference_model(broker: str, tmp_path: Path) -> None:
    records = generate(StreamShape(count=4000, seed=11))
    pipeline = await Pipeline(broker, tmp_path).create_topics()
    await run_to_completion(pipeline, records)
    spread = [len(p) for p in await read_partitions(pipeline.conf, pipeline.conf.events_topic)]
    assert len(spread) == 8 and min(spread) > 0, spread


async def test_the_check_that_inputs_are_committed_reports_what_no_worker_committed(
    broker: str, tmp_path: Path
) -> None:
    # `finish` and the fault matrix rely on it: outputs committed without their inputs'
    # offsets are otherwise seen only when the next owner makes them twice.
    pipeline = await Pipeline(broker, tmp_path).create_topics()
    await pipeline.produce(generate(StreamShape(count=300, seed=5)))
    behind = await input_left_uncommitted(pipeline, within=0)
    assert sum(b["end"] for b in behind.values()) == 300
    assert {b["committed"] for b in behind.values()} == {0}


async def test_every_kind_of_bad_input_is_dead_lettered_and_neighbours_processed(
    broker: str, tmp_path: Path
) -> None:
    good = generate(StreamShape(count=400, seed=5, invalid=0.0))
    oversize = b'{"type":"A","timestamp":"2024-02-09 21:00:00","value":1,"pad":"%s"}' % (
        b"x" * 70_000
    )
    bad: list[bytes | None] = [*INVALID_RECORDS, oversize]
    records: list[Record] = []
    for i, record in enumerate(good):
        records.append(record)
        if i % 20 == 0 and bad:
            records.append((b"bad-%d" % i, bad.pop()))
    assert not bad
    pipeline = await Pipeline(broker, tmp_path).create_topics()
    outputs = await run_to_completion(pipeline, records)
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
        await pipeline.produce([(b"sensor-A-1", lonely)])
        async with OutputReader(pipeline.conf) as reader:
            outputs = await wait_for_outputs(reader, 1, timeout=120)
    finally:
        worker.kill()
    # The watermark never passes the event: only the wall clock can expire it.
    assert outputs.unpaired == [
        {
            "timestamp": "2024-02-09T21:00:00Z",
            "type": "A",
            "value": 1,
            "id": "lonely",
            "reason": "expired",
        }
    ]


async def test_a_backlog_slower_than_max_wait_loses_no_pair_to_it(
    broker: str, tmp_path: Path
) -> None:
    """Max wait is 3 s and working through the backlog takes longer: while the
    watermark advances, nothing expires by the wall clock. Drained at the end."""
    pipeline = await Pipeline(
        broker,
        tmp_path,
        PAIRSTREAM_MAX_WAIT_SECONDS="3",
        PAIRSTREAM_TICK_INTERVAL_SECONDS="0.5",
    ).create_topics()
    records = generate(StreamShape(count=12_000, seed=17))
    await pipeline.produce(records)
    expected = await pipeline.expected(drained=True)
    worker = pipeline.worker().start()
    try:
        await worker.wait_ready()
        outputs = await finish(pipeline, [worker], expected)
    finally:
        worker.kill()
    assert compare(outputs, expected) == {}
    assert expected.pairs.total() > 5000


async def test_a_pairing_stage_behind_its_input_closes_no_key_by_max_wait(
    broker: str, tmp_path: Path
) -> None:
    """Max wait counts on the keyed records' timestamps (when ingest wrote them), not
    on the clock of a pairing stage that reaches them later. Written to one keyed
    partition within a moment, before the worker starts: every source's progress, a B,
    10,000 watermark records that advance nothing, a tick, and the B's A. Working
    through them takes the pairing stage longer than max wait (0.5 s); on its own
    clock it closed the B at the tick (expired) and took the A as late."""
    pipeline = await Pipeline(broker, tmp_path, PAIRSTREAM_MAX_WAIT_SECONDS="0.5").create_topics()
    conf = pipeline.conf
    key = "2024-02-09T21:00:00Z"
    time_us = 1_707_512_400_000_000
    keyed = partition_for(key, conf.partitions)
    marks = [
        encode_watermark(WatermarkUpdate(s, conf.events_partitions, time_us, idle=False))
        for s in range(conf.events_partitions)
    ]

    def event(kind: EventType, value: int) -> bytes:
        raw = json.dumps({"type": kind, "timestamp": key, "value": value, "id": f"{kind}-1"})
        parsed = parse_event(raw.encode(), conf.max_event_bytes)
        assert isinstance(parsed, Event)
        return encode_keyed_event(parsed, raw.encode(), Source(conf.events_topic, 0, 0), time_us)

    written = [*marks, event("B", 2), *(marks[0] for _ in range(10_000))]
    written += [TICK, event("A", 1)]
    producer = AIOKafkaProducer(**conf.kafka.aiokafka(), linger_ms=50)
    await producer.start()
    try:
        at_ms = int(time.time() * 1000)
        for value in written:
            record_key = WATERMARK_KEY if value in marks else b"~tick" if value == TICK else None
            await producer.send(conf.keyed_topic, value, record_key or key.encode(), keyed, at_ms)
        await producer.flush()
    finally:
        await producer.stop()
    worker = pipeline.worker().start()
    try:
        async with OutputReader(conf) as reader:
            outputs = await wait_for_outputs(reader, 1, 180)
            await stop_workers([worker])
            outputs = await reader.read_available()
    finally:
        worker.kill()
    pairs = [(p["a_id"], p["b_id"]) for p in outputs.pairs]
    assert (pairs, outputs.unpaired) == ([("A-1", "B-1")], [])


async def test_never_written_partitions_do_not_stop_expiry_by_event_time(
    broker: str, tmp_path: Path
) -> None:
    """Partitions 6 and 7 never get a record: idle_timeout after the assignment they
    stop holding the watermark back, and events expire by event time (max wait is out
    of reach). The six written go idle as well once the stream is over, so the final
    watermark is the largest progress. The timeout outlasts the wait from the
    assignment to the first records, which would otherwise wake up idle partitions."""
    pipeline = await Pipeline(
        broker, tmp_path, PAIRSTREAM_IDLE_TIMEOUT_SECONDS="10"
    ).create_topics()
    records = generate(StreamShape(count=3000, seed=23))
    # Spread like a partitioner over six partitions (by key, else round robin), and
    # produced in the stream's order, as a live producer would.
    placed = [
        (zlib.crc32(key) % 6 if key else n % 6, value) for n, (key, value) in enumerate(records)
    ]
    sources: list[list[bytes | None]] = [[] for _ in range(8)]
    for partition, value in placed:
        sources[partition].append(value)
    expected = pipeline.model(sources, all_idle=True)
    assert sum(n for k, n in expected.unpaired.items() if k[3] == "expired") > 20
    worker = pipeline.worker().start()
    try:
        await worker.wait_ready()
        await produce_to_partitions(pipeline, placed)
        assert await pipeline.input_partitions() == sources
        outputs = await finish(pipeline, [worker], expected)
    finally:
        worker.kill()
    assert compare(outputs, expected) == {}


def event(kind: str, timestamp: str, ident: str) -> bytes:
    return json.dumps({"type": kind, "timestamp": timestamp, "value": 1, "id": ident}).encode()


async def test_a_partition_empty_at_the_start_holds_the_watermark_until_its_first_record(
    broker: str, tmp_path: Path
) -> None:
    """A live stream filling a new two-partition topic, partition 1's first record an
    hour of event time behind partition 0's: that record is on time (its partition's
    progress is its own). A partition declared idle because it was empty when the
    worker started would let the watermark run on with partition 0, and B@21:00 would
    expire and A@21:00 come late (the live two-worker event-time run lost pairs so)."""
    pipeline = await Pipeline(broker, tmp_path, PAIRSTREAM_EVENTS_PARTITIONS="2").create_topics()
    first = [
        (0, event("B", "2024-02-09 21:00:00", "B-1")),
        (0, event("A", "2024-02-09 22:00:00", "A-2")),
        (0, event("B", "2024-02-09 22:00:00", "B-2")),
    ]
    then = [(1, event("A", "2024-02-09 21:00:00", "A-1"))]
    worker = pipeline.worker().start()
    try:
        await worker.wait_ready()
        # Wall-clock time passing is the condition here, not a synchronisation: the old
        # rule declared an empty partition idle at the first idle check (every second).
        await asyncio.sleep(3)
        await produce_to_partitions(pipeline, first)
        async with OutputReader(pipeline.conf) as reader:
            await wait_for_outputs(reader, 1, timeout=60)  # A-2 + B-2: partition 0 was read
        await produce_to_partitions(pipeline, then)
        expected = await pipeline.expected()
        outputs = await finish(pipeline, [worker], expected)
    finally:
        worker.kill()
    assert sorted((p["a_id"], p["b_id"]) for p in outputs.pairs) == [("A-1", "B-1"), ("A-2", "B-2")]
    assert outputs.unpaired == []
    assert compare(outputs, expected) == {}


async def idle_declarations(worker: Worker, count: int) -> None:
    deadline = time.monotonic() + 60
    while worker.log().count("is idle: it stops holding") < count:
        assert time.monotonic() < deadline, worker.log()[-4000:]
        await asyncio.sleep(0.2)  # polling the worker's log


async def test_a_partition_back_from_idle_holds_the_watermark_with_its_first_record(
    broker: str, tmp_path: Path
) -> None:
    """The watermark record ingest sends ahead of the first event after idleness says
    the partition is no longer idle (it used to say idle, and the partition went on
    not holding the watermark until its next progress was committed)."""
    pipeline = await Pipeline(
        broker, tmp_path, PAIRSTREAM_EVENTS_PARTITIONS="1", PAIRSTREAM_IDLE_TIMEOUT_SECONDS="1"
    ).create_topics()
    worker = pipeline.worker().start()
    try:
        await worker.wait_ready()
        await idle_declarations(worker, 1)  # empty since the start
        await produce_to_partitions(pipeline, [(0, event("A", "2024-02-09 21:00:00", "A-1"))])
        await idle_declarations(worker, 2)  # quiet since A-1
        await produce_to_partitions(pipeline, [(0, event("B", "2024-02-09 21:00:30", "B-2"))])
        keyed = pipeline.conf.keyed_topic
        partition = partition_for("2024-02-09T21:00:30Z", pipeline.conf.partitions)
        deadline = time.monotonic() + 60
        while True:
            records = (await read_partitions(pipeline.conf, keyed))[partition]
            # Handed to its keyed partition, or not: the records are in order either way.
            records = [((key or b"").removeprefix(HANDED), value) for key, value in records]
            at = [n for n, (key, _) in enumerate(records) if key == b"2024-02-09T21:00:30Z"]
            if at:
                break
            assert time.monotonic() < deadline, "B-2 never reached its keyed partition"
            await asyncio.sleep(0.5)  # until ingest's transaction with B-2 commits
    finally:
        worker.kill()
    [told] = [
        decode_watermark(json.loads(value or b"{}"))
        for key, value in records[: at[0]][-1:]
        if key == WATERMARK_KEY
    ]
    assert told == WatermarkUpdate(0, 1, 1707512430000000, idle=False)


async def test_a_worker_back_from_a_stall_declares_no_partition_idle_that_was_not(
    broker: str, tmp_path: Path
) -> None:
    """Records flow into the input while the worker is stopped for longer than the
    idle timeout (but not the session timeout). Back, its overdue timer can run
    before its first fetch, and every partition it had caught up on looked quiet and
    caught up: it declared them idle, though records had landed all along, and a
    watermark moved by other sources could then pass them. No partition is quiet for
    the idle timeout here at any moment, so no declaration may appear. Two stalls:
    the old code declared a partition idle in about one stall in eight."""
    pipeline = await Pipeline(
        broker, tmp_path, PAIRSTREAM_EVENTS_PARTITIONS="4", PAIRSTREAM_IDLE_TIMEOUT_SECONDS="3"
    ).create_topics()
    worker = pipeline.worker().start()
    sent = 0

    async def trickle(seconds: float) -> None:
        nonlocal sent
        until = time.monotonic() + seconds
        while time.monotonic() < until:  # a record into each partition every 0.2 s
            stamp = f"2024-02-09 21:{sent // 60 % 60:02d}:{sent % 60:02d}"
            placed = [(p, event("A", stamp, f"A-{p}-{sent}")) for p in range(4)]
            await produce_to_partitions(pipeline, placed)
            sent += 1
            await asyncio.sleep(0.2)  # the stream's pace, not a synchronisation

    try:
        await worker.wait_ready()
        assert worker.process is not None
        await trickle(3)
        for _ in range(2):
            # Quiet for 1 s, a third of the idle timeout. Time passing is the point: a
            # worker caught up and committed when it stops is the hazard (the old code
            # failed 1 stall in 8 without it); what is asserted holds either way.
            await asyncio.sleep(1)
            os.killpg(worker.process.pid, signal.SIGSTOP)
            await trickle(6)  # the stall: past the idle timeout, inside the session's
            os.killpg(worker.process.pid, signal.SIGCONT)
            await trickle(2)  # back, through two idle checks
    finally:
        worker.kill()
    log = worker.log()
    assert "is idle: it stops holding" not in log, log[-4000:]


async def produce_to_partitions(pipeline: Pipeline, placed: list[tuple[int, bytes | None]]) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(**pipeline.conf.kafka.aiokafka(), linger_ms=5)
    await producer.start()
    try:
        sends = [
            # A record with neither key nor value cannot be sent.
            await producer.send(
                pipeline.conf.events_topic,
                value,
                key=None if value is not None else b"null",
                partition=partition,
            )
            for partition, value in placed
        ]
        await asyncio.gather(*sends)
    finally:
        await producer.stop()


async def test_a_worker_started_before_its_input_topic_exists_consumes_it(
    broker: str, tmp_path: Path
) -> None:
    pipeline = Pipeline(broker, tmp_path)  # no topic created
    records = generate(StreamShape(count=2000, seed=29))
    await run_to_completion(pipeline, records)


@pytest.mark.parametrize("lose_data_dir", [False, True], ids=["local-rocksdb", "changelog-only"])
async def test_state_survives_a_restart(broker: str, tmp_path: Path, lose_data_dir: bool) -> None:
    """Half the stream, a clean stop, then the rest: pending events of the first
    half must pair with partners in the second, from local RocksDB or, with the
    data dir gone, from the changelog alone."""
    records = generate(StreamShape(count=3000, seed=21))
    pipeline = await Pipeline(broker, tmp_path).create_topics()
    first, second = records[:1500], records[1500:]
    worker = pipeline.worker()
    try:
        async with OutputReader(pipeline.conf) as reader:
            worker.start()
            await worker.wait_ready()
            await pipeline.produce(first)
            expected_first = await pipeline.expected()
            await wait_for_outputs(reader, expected_total(expected_first), timeout=180)
            worker.stop()
            if lose_data_dir:
                shutil.rmtree(worker.data_dir)
            worker.start()
            await worker.wait_ready()
            await pipeline.produce(second)
            expected = await pipeline.expected()
            await wait_for_outputs(reader, expected_total(expected), timeout=180)
            worker.stop()
            outputs = await reader.read_available()
    finally:
        worker.kill()
    assert expected_first.pending  # some events wait across the restart
    assert compare(outputs, expected) == {}


async def test_after_a_kill_local_state_is_the_committed_changelog(
    broker: str, tmp_path: Path
) -> None:
    """kill -9 while a live stream flows: each local partition of the pairing state
    holds exactly what the committed changelog holds up to the offset faust restores
    from (nothing of an aborted or open transaction); restarted on it, the worker
    gives the model's outputs."""
    records = generate(StreamShape(count=8000, seed=37))
    pipeline = await Pipeline(broker, tmp_path).create_topics()
    worker = pipeline.worker()
    try:
        async with OutputReader(pipeline.conf) as reader:
            worker.start()
            await worker.wait_ready()
            producing = asyncio.create_task(pipeline.produce(records, rate=2000))
            await wait_for_outputs(reader, 1500, timeout=180)
            worker.kill()
            await producing
        changelog = await read_logged(
            pipeline.conf, f"{pipeline.conf.app_id}-pairing-state-changelog"
        )
        for partition in range(pipeline.conf.partitions):
            [path] = worker.data_dir.glob(f"**/*pairing-state-{partition}.db")
            local, persisted = read_local_partition(path)
            assert persisted is not None, f"partition {partition}: nothing committed to it"
            assert local == state_up_to(changelog[partition], persisted)
        worker.start()
        await worker.wait_ready()
        # It did not wait for its predecessor's session to time out
        # (app/exactly_once/predecessor.py).
        assert "removed the previous member" in worker.log()
        expected = await pipeline.expected()
        outputs = await finish(pipeline, [worker], expected)
    finally:
        worker.kill()
    assert compare(outputs, expected) == {}


async def test_a_worker_given_inputs_without_their_changelogs_stops(
    broker: str, tmp_path: Path
) -> None:
    """A changelog deleted under a running worker: the group's next assignment has
    the keyed partitions but none of the changelog's, which the worker must not run
    on tables that no restore filled. It stops, saying which partitions were missing."""
    pipeline = await Pipeline(broker, tmp_path).create_topics()
    worker = pipeline.worker().start()
    changelog = f"{pipeline.conf.app_id}-pairing-state-changelog"
    try:
        await worker.wait_ready()
        async with admin_client(pipeline.conf) as admin:
            await admin.delete_topics([changelog])
        deadline = time.monotonic() + 90  # metadata refresh (10 s), then a rebalance
        while worker.running and time.monotonic() < deadline:
            await asyncio.sleep(0.5)  # polling the process
        log = worker.log()
        assert not worker.running, log[-4000:]
        assert "without the changelog partitions of their state" in log, log[-4000:]
        assert f"{changelog}[0]" in log
    finally:
        worker.kill()
