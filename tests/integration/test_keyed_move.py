"""More keyed partitions: a pipeline on 4 keyed partitions is stopped with
events pending, moved by `python -m tools.move_keyed` to a new app id on 8, and the
rest of the stream goes through the new one. The outputs of both, together, equal the
model over the whole input: nothing pending lost, nothing emitted twice."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import NewTopic

from app.kafka.access import EX_CONFIG
from app.kafka.admin import admin_client
from pairing.records import CLOCK_KEY
from tests.integration.harness import (
    ROOT,
    Pipeline,
    Worker,
    compare,
    finish,
    input_left_uncommitted,
    stop_workers,
    table,
)
from tests.integration.test_event_time import DRAINS, stream
from tools.move_keyed import OpenTransactions, unread_keyed

RECORDS = int(os.environ.get("PAIRSTREAM_EVENT_TIME_RECORDS", "6000"))
NEW_PARTITIONS = 8


def move(pipeline: Pipeline, *args: str) -> subprocess.CompletedProcess[str]:
    """The command, as a user runs it: the old pipeline's settings in the environment."""
    return subprocess.run(
        [sys.executable, "-m", "tools.move_keyed", *args],
        cwd=ROOT,
        env={**os.environ, **pipeline.env_vars},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def target(pipeline: Pipeline) -> list[str]:
    return [
        "--app-id",
        f"{pipeline.conf.app_id}-moved",
        "--partitions",
        str(NEW_PARTITIONS),
        "--keyed-topic",
        f"{pipeline.conf.keyed_topic}-{NEW_PARTITIONS}",
    ]


async def accepted(pipeline: Pipeline, args: list[str]) -> subprocess.CompletedProcess[str]:
    """A dry run, repeated while it refuses for what only waiting ends: a worker SIGKILLed
    after the grace period stays in the group until its session timeout, and its open
    transaction holds the partitions' ends until the broker aborts it."""
    deadline = time.monotonic() + 300
    while True:
        checked = move(pipeline, *args, "--dry-run")
        if checked.returncode == 0:
            return checked
        waits = "stop every worker" in checked.stderr or "open transactions" in checked.stderr
        assert waits and time.monotonic() < deadline, checked.stderr
        await asyncio.sleep(1)  # a session timeout or a transaction timeout runs out


async def keyed_events_unread(pipeline: Pipeline) -> bool:
    """Running workers keep transactions open on the keyed topic (ticks, watermarks):
    while one is open, what is left to read is not known yet."""
    try:
        return any(u.events for u in (await unread_keyed(pipeline.conf)).values())
    except OpenTransactions:
        return True


async def wait_until_drained(pipeline: Pipeline, workers: list[Worker]) -> None:
    """Ingest has committed all the input, and pairing all the keyed events ingest
    wrote (the procedure's first step: docs/deploy.md)."""
    while await input_left_uncommitted(pipeline, within=5.0):
        for worker in workers:
            assert worker.running, worker.log()[-4000:]
    while await keyed_events_unread(pipeline):
        for worker in workers:
            assert worker.running, worker.log()[-4000:]
        await asyncio.sleep(0.5)  # a commit interval


async def test_a_move_to_more_keyed_partitions_loses_and_repeats_nothing(
    broker: str, tmp_path: Path
) -> None:
    old = await Pipeline(broker, tmp_path, PAIRSTREAM_EVENTS_PARTITIONS="3").create_topics()
    records = stream(RECORDS)
    half = len(records) // 2
    # Before the move: the first half of the stream, in the topic before the workers start.
    await old.produce(records[:half])
    workers = [old.worker(0), old.worker(1)]
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            await worker.wait_ready()
        await wait_until_drained(old, workers)
        running = move(old, *target(old), "--dry-run")
        assert running.returncode == 2 and "stop every worker" in running.stderr, running.stderr
        await stop_workers(workers)
    finally:
        for worker in workers:
            worker.kill()

    args = target(old)
    new_id, new_keyed = args[1], args[5]
    checked = await accepted(old, args)
    moved = move(old, *args)
    assert moved.stdout.splitlines()[0] == checked.stdout.splitlines()[0]
    assert moved.returncode == 0, moved.stderr
    summary = json.loads(moved.stdout.splitlines()[0])
    assert summary["keys_with_a_pending_event"] > 0
    # Run twice, it refuses: the new app id holds the state now.
    again = move(old, *args)
    assert again.returncode == 2 and "refused:" in again.stderr, again.stderr

    new = Pipeline(
        broker,
        tmp_path,
        **{
            **old.env_vars,
            "PAIRSTREAM_APP_ID": new_id,
            "PAIRSTREAM_KEYED_TOPIC": new_keyed,
            "PAIRSTREAM_PARTITIONS": str(NEW_PARTITIONS),
            **DRAINS,
        },
    )
    state = await table(new, "pairing-state")
    pending = {k for k, v in state.items() if k != CLOCK_KEY.decode() and json.loads(v)["pending"]}
    assert len(pending) == summary["keys_with_a_pending_event"]
    async with admin_client(new.conf) as admin:
        committed = await admin.list_consumer_group_offsets(new_id)
    assert {tp.topic for tp in committed} == {new.conf.events_topic}
    assert sorted(tp.partition for tp in committed) == [0, 1, 2]
    assert all(isinstance(m.offset, int) and m.offset > 0 for m in committed.values())
    assert TopicPartition(new.conf.events_topic, 0) in committed

    # After: the rest of the stream, then workers of the new app id on fresh data dirs.
    await new.produce(records[half:])
    workers = [new.worker(2), new.worker(3)]
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            await worker.wait_ready()
        expected = await new.expected(drained=True)
        outputs = await finish(new, workers, expected)
    finally:
        for worker in workers:
            worker.kill()
    assert compare(outputs, expected) == {}
    # Pairs made of an event before the move and its partner after it.
    across = {p["timestamp"] for p in outputs.pairs} & pending
    assert across, "no pending event found its partner after the move"
    assert expected.pairs.total() > RECORDS // 3
    print(
        f"moved {summary['keys']} keys, {len(pending)} pending, {len(across)} paired after the"
        f" move; outputs {outputs.summary()}"
    )


async def test_a_move_refuses_while_pairing_has_keyed_events_to_read(
    broker: str, tmp_path: Path
) -> None:
    """A keyed event that ingest wrote and pairing did not read: the move would lose it."""
    pipeline = await Pipeline(broker, tmp_path).create_topics()
    conf = pipeline.conf
    async with admin_client(conf) as admin:
        changelog = NewTopic(f"{conf.app_id}-pairing-state-changelog", conf.partitions, 1)
        await admin.create_topics([changelog])
    producer = AIOKafkaProducer(**conf.kafka.aiokafka())
    await producer.start()
    try:
        await producer.send_and_wait(conf.keyed_topic, b"{}", b"2024-02-09T21:00:00Z", 1)
    finally:
        await producer.stop()
    refused = move(pipeline, *target(pipeline), "--dry-run")
    assert refused.returncode == 2, refused.stderr
    assert "pairing has not read 1 keyed events" in refused.stderr, refused.stderr


async def test_a_worker_on_another_keyed_count_says_to_move_and_exits(
    broker: str, tmp_path: Path
) -> None:
    """PAIRSTREAM_PARTITIONS changed alone: the worker stops before it joins, naming the
    topics and the move, and writes nothing."""
    made = await Pipeline(broker, tmp_path).create_topics()  # 4 keyed partitions
    changed = Pipeline(broker, tmp_path, **{**made.env_vars, "PAIRSTREAM_PARTITIONS": "8"})
    worker = changed.worker().start()
    assert worker.process is not None
    deadline = time.monotonic() + 60
    while worker.process.poll() is None:
        assert time.monotonic() < deadline, worker.log()[-3000:]
        await asyncio.sleep(0.2)  # polling the process
    assert worker.process.returncode == EX_CONFIG, worker.log()[-3000:]
    [line] = [line for line in worker.log().splitlines() if "cannot start:" in line]
    assert f"{made.conf.keyed_topic} has 4" in line and "docs/keyed-move.md" in line, line
    async with admin_client(made.conf) as admin:
        offsets = await admin.list_consumer_group_offsets(made.conf.app_id)
    assert offsets == {}
