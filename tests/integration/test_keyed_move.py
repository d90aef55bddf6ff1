"""More keyed partitions: a pipeline on 4 keyed partitions is stopped with
events pending, moved by `python -m tools.move_keyed` to a new app id on 8, and the
rest of the stream goes through the new one. The outputs of both, together, equal the
model over the whole input: nothing pending lost, nothing emitted twice. And the
command's checks against the broker: the input taken as it is, a running worker named,
the group coordinator's errors waited out, and whether pairing has drained."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import (
    GroupCoordinatorNotAvailableError,
    GroupLoadInProgressError,
    NotCoordinatorForGroupError,
)
from aiokafka.structs import OffsetAndMetadata

from app.kafka.access import EX_CONFIG
from app.kafka.admin import admin_client, described_partitions
from app.settings import Settings
from pairing.records import CLOCK_KEY
from tests.integration.harness import (
    ROOT,
    Pipeline,
    Worker,
    compare,
    finish,
    stop_workers,
    table,
)
from tests.integration.test_event_time import DRAINS, stream
from tools import move_keyed
from tools.move_keyed import TICK_KEY, Target, check_drained

RECORDS = int(os.environ.get("PAIRSTREAM_EVENT_TIME_RECORDS", "6000"))
NEW_PARTITIONS = 8
KEY = b"2024-02-09T21:00:00Z"


def move(
    pipeline: Pipeline, *args: str, unset: Iterable[str] = ()
) -> subprocess.CompletedProcess[str]:
    """The command, as a user runs it: the old pipeline's settings in the environment,
    but those `unset`."""
    environment = {**os.environ, **pipeline.env_vars}
    return subprocess.run(
        [sys.executable, "-m", "tools.move_keyed", *args],
        cwd=ROOT,
        env={name: value for name, value in environment.items() if name not in unset},
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


async def wait_until_drained(pipeline: Pipeline, workers: list[Worker]) -> None:
    """Until the command's check says ingest has read all the input, and pairing all
    the keyed events ingest wrote (the procedure's first step: docs/keyed-move.md)."""
    deadline = time.monotonic() + 300
    while reasons := (await check_drained(pipeline.conf)).reasons():
        for worker in workers:
            assert worker.running, worker.log()[-4000:]
        assert time.monotonic() < deadline, reasons
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
        drained = move(old, "--check-drained")
        assert drained.returncode == 0, drained.stdout + drained.stderr
        assert json.loads(drained.stdout.splitlines()[0])["drained"] is True
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
        None,
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
    changed = Pipeline(broker, tmp_path, None, **{**made.env_vars, "PAIRSTREAM_PARTITIONS": "8"})
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


async def with_pairing_changelog(pipeline: Pipeline) -> Pipeline:
    """The topics a worker would have made: the pipeline's, and the pairing state's."""
    await pipeline.create_topics()
    conf = pipeline.conf
    async with admin_client(conf) as admin:
        changelog = NewTopic(f"{conf.app_id}-pairing-state-changelog", conf.partitions, 1)
        await admin.create_topics([changelog])
    return pipeline


@asynccontextmanager
async def transactional(conf: Settings) -> AsyncIterator[AIOKafkaProducer]:
    """A transactional producer, as a worker's: records and offsets commit together."""
    producer = AIOKafkaProducer(
        **conf.kafka.aiokafka(), transactional_id=f"test-{uuid.uuid4().hex[:8]}"
    )
    await producer.start()
    try:
        yield producer
    finally:
        await producer.stop()


def offsets(offsets: dict[TopicPartition, int]) -> dict[TopicPartition, OffsetAndMetadata]:
    return {tp: OffsetAndMetadata(offset, "") for tp, offset in offsets.items()}


def summary(ran: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The command's JSON line."""
    found: dict[str, Any] = json.loads(ran.stdout.splitlines()[0])
    return found


async def test_the_input_is_taken_with_the_partitions_the_broker_has(
    broker: str, tmp_path: Path
) -> None:
    """A 4-partition input run with PAIRSTREAM_EVENTS_PARTITIONS unset (8), or set to
    another count: as a worker does, the command takes the input as it is."""
    old = await with_pairing_changelog(Pipeline(broker, tmp_path, PAIRSTREAM_EVENTS_PARTITIONS="4"))
    conf = old.conf
    committed = {p: 10 * (p + 1) for p in range(4)}
    async with transactional(conf) as producer, producer.transaction():
        inputs = {TopicPartition(conf.events_topic, p): o for p, o in committed.items()}
        await producer.send_offsets_to_transaction(offsets(inputs), conf.app_id)
    unset = ["PAIRSTREAM_EVENTS_PARTITIONS"]
    checked = move(old, *target(old), "--dry-run", unset=unset)
    assert checked.returncode == 0, checked.stderr
    assert summary(checked)["input_partitions"] == 4
    assert summary(checked)["input_offsets"] == {str(p): o for p, o in committed.items()}
    other = Pipeline(
        broker, tmp_path, None, **{**old.env_vars, "PAIRSTREAM_EVENTS_PARTITIONS": "2"}
    )
    assert move(other, *target(old), "--dry-run").stdout == checked.stdout

    args = target(old)
    moved = move(old, *args, unset=unset)
    assert moved.returncode == 0, moved.stderr
    new_progress = f"{args[1]}-source-progress-changelog"
    assert await described_partitions(conf, [new_progress]) == {new_progress: 4}
    async with admin_client(conf) as admin:
        new_offsets = await admin.list_consumer_group_offsets(args[1])
    assert {tp.partition: m.offset for tp, m in new_offsets.items()} == committed


async def test_a_move_while_a_worker_runs_names_the_worker(broker: str, tmp_path: Path) -> None:
    """The refusal names each member as the broker describes it, to find the process by."""
    pipeline = await Pipeline(broker, tmp_path).create_topics()
    worker = pipeline.worker().start()
    try:
        await worker.wait_ready()
        refused = move(pipeline, *target(pipeline), "--dry-run")
        async with admin_client(pipeline.conf) as admin:
            [response] = await admin.describe_consumer_groups([pipeline.conf.app_id])
        await stop_workers([worker])
    finally:
        worker.kill()
    _, _, state, _, _, members, *_ = response.groups[0]
    assert state == "Stable" and members, response
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.startswith("refused: workers of the old app run: client id ")
    for member_id, client_id, host, *_ in members:
        assert f"client id {client_id} on host {host} (member id {member_id})" in refused.stderr
    assert "stop every worker" in refused.stderr


class BrokerJustStarted:
    """The admin client's group calls as a broker that has just started answers them:
    first its coordinator errors, one after the other, then the broker's own answers."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.describe = AIOKafkaAdminClient.describe_consumer_groups
        self.offsets = AIOKafkaAdminClient.list_consumer_group_offsets
        self.describes_failed = self.offsets_failed = 0

        # Functions, not bound methods: the admin client becomes their first argument.
        async def describe(admin: AIOKafkaAdminClient, groups: list[str]) -> Any:
            return await self.describe_groups(admin, groups)

        async def list_offsets(admin: AIOKafkaAdminClient, group: str, **kwargs: Any) -> Any:
            return await self.list_offsets(admin, group, **kwargs)

        monkeypatch.setattr(AIOKafkaAdminClient, "describe_consumer_groups", describe)
        monkeypatch.setattr(AIOKafkaAdminClient, "list_consumer_group_offsets", list_offsets)

    async def describe_groups(self, admin: AIOKafkaAdminClient, groups: list[str]) -> Any:
        self.describes_failed += 1
        if self.describes_failed == 1:
            raise GroupCoordinatorNotAvailableError("Unable to get coordinator id")
        if self.describes_failed <= 3:
            code = {2: GroupLoadInProgressError, 3: NotCoordinatorForGroupError}[
                self.describes_failed
            ].errno
            return [SimpleNamespace(groups=[(code, groups[0], "", "", "", [])])]
        return await self.describe(admin, groups)

    async def list_offsets(self, admin: AIOKafkaAdminClient, group: str, **kwargs: Any) -> Any:
        if self.offsets_failed < 2:
            self.offsets_failed += 1
            raise GroupLoadInProgressError()
        return await self.offsets(admin, group, **kwargs)


async def test_the_coordinators_errors_are_waited_out_against_the_real_broker(
    broker: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A move checked just after a broker start: COORDINATOR_NOT_AVAILABLE from the
    look-up of the coordinator, COORDINATOR_LOAD_IN_PROGRESS and NOT_COORDINATOR in
    describe answers, and a look-up of offsets failing twice, then the broker's
    answers. The plan is the one read without them."""
    pipeline = await with_pairing_changelog(Pipeline(broker, tmp_path))
    conf = pipeline.conf
    async with transactional(conf) as producer, producer.transaction():
        input0 = TopicPartition(conf.events_topic, 0)
        await producer.send_offsets_to_transaction(offsets({input0: 7}), conf.app_id)
    new = Target(f"{conf.app_id}-moved", NEW_PARTITIONS, f"{conf.keyed_topic}-moved")
    want = await move_keyed.plan(conf, new)
    flaky = BrokerJustStarted(monkeypatch)
    started = time.monotonic()
    got = await move_keyed.plan(conf, new)
    assert flaky.describes_failed > 3 and flaky.offsets_failed == 2
    assert got.summary() == want.summary() and got.input_offsets == {0: 7}
    assert time.monotonic() - started < move_keyed.COORDINATOR_WAIT_SECONDS


async def high_watermark(conf: Settings, tp: TopicPartition) -> int:
    """Where the next record of `tp` would go: past its commit and abort markers too."""
    consumer = AIOKafkaConsumer(**conf.kafka.aiokafka(), isolation_level="read_uncommitted")
    await consumer.start()
    try:
        ends: dict[TopicPartition, int] = await consumer.end_offsets([tp])
    finally:
        await consumer.stop()
    return ends[tp]


async def test_drained_reads_past_commit_markers_and_aborted_records(
    broker: str, tmp_path: Path
) -> None:
    """Ingest wrote a keyed event in a transaction; pairing has not read it: not
    drained. Pairing commits its offset past it in a transaction of its own: drained,
    though the commit marker after the event leaves a lag of 1 for ever; and an aborted
    record or a tick past it does not undo that."""
    pipeline = await with_pairing_changelog(Pipeline(broker, tmp_path))
    conf = pipeline.conf
    input0, input1 = (TopicPartition(conf.events_topic, p) for p in (0, 1))
    keyed0 = TopicPartition(conf.keyed_topic, 0)
    plain = AIOKafkaProducer(**conf.kafka.aiokafka())
    await plain.start()
    try:
        for tp in (input0, input1):
            await plain.send_and_wait(tp.topic, b"{}", KEY, tp.partition)
    finally:
        await plain.stop()
    async with transactional(conf) as producer:
        async with producer.transaction():  # ingest read input 0 and wrote its event
            await producer.send(conf.keyed_topic, b"{}", KEY, partition=0)
            await producer.send_offsets_to_transaction(offsets({input0: 1}), conf.app_id)
        left = move(pipeline, "--check-drained")
        assert left.returncode == 1, left.stdout + left.stderr
        assert summary(left)["input_partitions_with_unread_records"] == [1]
        assert summary(left)["keyed"]["0"]["unread_events"] == 1
        assert left.stdout.splitlines()[1] == (
            "not drained: ingest has not read input partitions [1]; pairing has not read 1"
            " keyed events of partition 0"
        )

        async with producer.transaction():  # ingest read input 1: a tick only
            await producer.send(conf.keyed_topic, b"", TICK_KEY, partition=1)
            await producer.send_offsets_to_transaction(offsets({input1: 1}), conf.app_id)
        async with producer.transaction():  # pairing read keyed 0
            await producer.send_offsets_to_transaction(offsets({keyed0: 1}), conf.app_id)
        assert await high_watermark(conf, keyed0) == 2  # the event, its commit marker
        drained = move(pipeline, "--check-drained")
        assert drained.returncode == 0, drained.stdout + drained.stderr
        assert summary(drained)["keyed"]["0"]["committed_offset"] == 1
        assert summary(drained)["keyed"]["1"]["unread_ticks"] == 1
        assert drained.stdout.splitlines()[1].startswith("drained:")

        await producer.begin_transaction()  # a record that never commits
        await producer.send_and_wait(conf.keyed_topic, b"{}", KEY, partition=0)
        await producer.abort_transaction()
    assert await high_watermark(conf, keyed0) == 4  # and its abort marker
    still = move(pipeline, "--check-drained")
    assert still.returncode == 0, still.stdout + still.stderr
