"""The broker calls recovery relies on (read_committed probes, removing a dead group
member), against the real broker."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import IllegalGenerationError, KafkaConnectionError, UnknownMemberIdError
from faust.types import TP

from app.exactly_once import internals
from app.kafka.admin import TopicsNotReady, end_offsets, last_committed_records, wait_until_ready
from app.kafka.connection import KafkaConnection
from app.kafka.txn_offset_commit import GroupMember
from app.settings import Settings
from tests.conftest import broker_nodes
from tools import broker as local_broker

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]


async def new_topic(broker: str, name: str) -> str:
    """A new topic of 4 partitions."""
    topic = f"it-{uuid.uuid4().hex[:10]}-{name}"
    admin = AIOKafkaAdminClient(bootstrap_servers=broker)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 4, 1)])
    finally:
        await admin.close()
    return topic


async def test_the_last_committed_record_is_found_behind_markers_and_aborted_records(
    broker: str,
) -> None:
    conf = Settings(broker=f"kafka://{broker}")
    topic = await new_topic(broker, "tails")
    producer = AIOKafkaProducer(bootstrap_servers=broker, transactional_id=f"{topic}-tx")
    await producer.start()
    try:
        # Partition 0: a committed transaction, then an aborted one after it.
        async with producer.transaction():
            for _ in range(5):
                await producer.send_and_wait(topic, b"committed", partition=0)
        await producer.begin_transaction()
        for _ in range(30):
            await producer.send_and_wait(topic, b"aborted", partition=0)
        await producer.abort_transaction()
        # Partition 1: only an aborted transaction. Partition 2: committed records
        # further back than the window. Partition 3: nothing.
        await producer.begin_transaction()
        await producer.send_and_wait(topic, b"aborted", partition=1)
        await producer.abort_transaction()
        async with producer.transaction():
            await producer.send_and_wait(topic, b"committed", partition=2)
        await producer.begin_transaction()
        for _ in range(40):
            await producer.send_and_wait(topic, b"aborted", partition=2)
        await producer.abort_transaction()
    finally:
        await producer.stop()
    tps = [TP(topic, p) for p in range(4)]
    ends = await end_offsets(conf, tps)
    # 5 records + marker, 30 aborted + marker; 1 aborted + marker; 1 + marker, 40 + marker
    assert ends == {tps[0]: 37, tps[1]: 2, tps[2]: 43, tps[3]: 0}
    assert await last_committed_records(conf, ends, window=40) == {tps[0]: 4}
    assert await last_committed_records(conf, ends, window=100) == {tps[0]: 4, tps[2]: 0}


# A group member that dies without leaving: joins, prints its member id, then waits to
# be killed. Its session (60 s) outlasts the test's waits.
DYING_MEMBER = """
import asyncio, sys
from aiokafka import AIOKafkaConsumer
from app.exactly_once import internals

async def main(broker, topic, group):
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=broker, group_id=group, session_timeout_ms=60000
    )
    await consumer.start()
    while not consumer.assignment():
        await consumer.getmany(timeout_ms=200)
    print(internals.group_member_id(consumer), flush=True)
    await asyncio.sleep(3600)

asyncio.run(main(*sys.argv[1:]))
"""


async def assigned_within(consumer: AIOKafkaConsumer, seconds: float) -> set[TopicPartition]:
    # aiokafka joins in the background (getmany would block until it is assigned).
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not consumer.assignment():
        await asyncio.sleep(0.1)
    return set(consumer.assignment())


async def test_removing_a_dead_member_lets_the_group_rebalance_at_once(broker: str) -> None:
    """What a worker restarted after kill -9 does for its predecessor
    (app/exactly_once/predecessor.py)."""
    topic = await new_topic(broker, "members")
    group = f"{topic}-group"
    dying = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        DYING_MEMBER,
        broker,
        topic,
        group,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert dying.stdout is not None
        member_id = (await asyncio.wait_for(dying.stdout.readline(), 60)).decode().strip()
    finally:
        dying.kill()
        await dying.wait()
    assert member_id
    successor = AIOKafkaConsumer(bootstrap_servers=broker, group_id=group)
    await successor.start()  # with topics given here, start() waits for an assignment
    successor.subscribe([topic])
    try:
        # The coordinator waits for the dead member to rejoin, until its session ends.
        assert await assigned_within(successor, 6) == set()
        await internals.remove_group_member(KafkaConnection(broker), group, member_id)
        assert await assigned_within(successor, 30) == {TopicPartition(topic, p) for p in range(4)}
        with pytest.raises(UnknownMemberIdError):
            await internals.remove_group_member(KafkaConnection(broker), group, member_id)
    finally:
        await successor.stop()


async def test_committed_offsets_are_read_right_after_a_broker_restart(broker: str) -> None:
    """A restarted broker answers a look-up of committed offsets with a group-level error
    and no partitions while its group coordinator loads; aiokafka alone took that for
    "nothing committed" (docs/faust-gaps.md, point 22). The worker's consumer waits it
    out (`internals.check_offset_fetch_errors`); a plain one, asking at the same time,
    shows whether the look-ups fell in that window at all."""
    topic = await new_topic(broker, "committed")
    group = f"it-{uuid.uuid4().hex[:10]}"
    tps = [TopicPartition(topic, p) for p in range(4)]
    producer = AIOKafkaProducer(bootstrap_servers=broker, transactional_id=f"{group}-tx")
    await producer.start()
    try:
        for n in range(1, 21):
            async with producer.transaction():
                offsets = {tp: n * 10 + tp.partition for tp in tps}
                await producer.send_offsets_to_transaction(offsets, group)
    finally:
        await producer.stop()
    committed = {tp: 200 + tp.partition for tp in tps}

    async def look_up(checked: bool) -> dict[TopicPartition, int | None]:
        while True:
            consumer = AIOKafkaConsumer(bootstrap_servers=broker, group_id=group)
            if checked:
                internals.stable_offset_look_ups(consumer)
            try:
                await consumer.start()
                break
            except KafkaConnectionError:
                await consumer.stop()
                await asyncio.sleep(0.05)
        try:
            return {tp: await consumer.committed(tp) for tp in tps}
        finally:
            await consumer.stop()

    # EndTxn returns once the commit is decided; the markers that make its offsets
    # visible are written after it. Killed before them, the broker completes the commit
    # only some time after its restart: a look-up at version 3 then reads the offsets of
    # the transaction before (190-193 in a make test run), ours waits for the markers
    # (require_stable, docs/faust-gaps.md, point 23).
    nodes = broker_nodes()
    local_broker.stop(nodes, hard=True)
    # The look-ups start while the broker starts, and go out as soon as it takes
    # connections: the window comes right after that.
    restart = asyncio.ensure_future(asyncio.to_thread(local_broker.start, nodes, 180))
    ours, plain = await asyncio.gather(look_up(checked=True), look_up(checked=False))
    await restart
    assert ours == committed
    if plain == committed:
        pytest.skip("the coordinator had loaded before the first look-up: nothing shown")
    # Some look-ups read "nothing committed", as aiokafka alone answers a coordinator
    # still loading, or the transaction before's offsets.
    assert all(plain[tp] in (None, offset, offset - 10) for tp, offset in committed.items())


@pytest.mark.parametrize("tracked", [False, True], ids=["aiokafka", "known-topics-tracked"])
async def test_a_send_to_a_new_topic_keeps_the_batches_of_the_others_going(
    broker: str, tracked: bool
) -> None:
    # aiokafka's producer asks for every topic's metadata until its first send to a
    # topic it does not know, then for that one only: a batch already waiting for
    # another topic loses its leader, and a flush (a commit's) never ends. Should
    # aiokafka fix it, the first case fails, and internals.track_known_topics can go.
    known = await new_topic(broker, "known")
    # A batch with no leader fails after the request timeout (from its creation): the
    # hung flush is given up at 10 s, and stop() waits for that failure.
    producer = AIOKafkaProducer(bootstrap_servers=broker, linger_ms=3000, request_timeout_ms=20_000)
    if tracked:
        internals.track_known_topics(producer)
    await producer.start()
    try:
        while producer.client.cluster.partitions_for_topic(known) is None:
            await producer.client.force_metadata_update()  # the topic is new to the broker too
        waiting = await producer.send(known, b"lingering", partition=0)
        await producer.send(await new_topic(broker, "new"), b"first", partition=0)
        try:
            await asyncio.wait_for(producer.flush(), 10)
        except TimeoutError:
            assert not tracked, "the flush hung with the known topics tracked"
            return
        assert tracked, "aiokafka kept the other topics' metadata: the workaround can go"
        assert (await waiting).offset == 0
    finally:
        await asyncio.wait_for(producer.stop(), 30)


async def test_topics_are_ready_once_the_broker_shows_every_partition(broker: str) -> None:
    conf = Settings(broker=f"kafka://{broker}")
    topic = await new_topic(broker, "ready")
    await wait_until_ready(conf, {topic: 4}, 30)  # created: 4 partitions, each with a leader
    with pytest.raises(TopicsNotReady, match="never-created"):
        await wait_until_ready(conf, {f"{topic}-never-created": 1, topic: 4}, 1)
    with pytest.raises(TopicsNotReady):
        await wait_until_ready(conf, {topic: 5}, 1)  # fewer partitions than wanted


async def test_a_transaction_s_offsets_commit_only_for_a_current_group_member(broker: str) -> None:
    """The fencing of one transaction per worker (app/kafka/txn_offset_commit.py): offsets
    committed as the group's current member are visible once the transaction commits;
    as a member of an older generation, or as one the group does not know, the
    coordinator refuses them and the transaction cannot commit."""
    topic = await new_topic(broker, "member")
    group = f"it-{uuid.uuid4().hex[:10]}"
    tp = TopicPartition(topic, 0)
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=broker, group_id=group)
    internals.stable_offset_look_ups(consumer)  # as the worker's: a commit's markers waited for
    await consumer.start()
    try:
        while not consumer.assignment():  # joined: a generation and a member id
            await consumer.getmany(timeout_ms=100)
        current = internals.group_member(SimpleNamespace(_thread=ConsumerThread(consumer)))
        assert current.generation_id >= 1 and current.member_id
        older = replace(current, generation_id=current.generation_id - 1)
        unknown = replace(current, member_id="not-a-member")

        async def producer_as(member: GroupMember) -> AIOKafkaProducer:
            producer = AIOKafkaProducer(bootstrap_servers=broker, transactional_id=f"{group}-tx")
            internals.commit_offsets_as_member(producer, lambda: member, 0.005)
            await producer.start()
            return producer

        producer = await producer_as(current)
        try:
            async with producer.transaction():
                await producer.send_offsets_to_transaction({tp: 7}, group)
        finally:
            await producer.stop()
        assert await consumer.committed(tp) == 7
        for member, refused in ((older, IllegalGenerationError), (unknown, UnknownMemberIdError)):
            producer = await producer_as(member)
            try:
                await producer.begin_transaction()
                with pytest.raises(refused):
                    await producer.send_offsets_to_transaction({tp: 9}, group)
            finally:
                await producer.stop()  # failed for good: its transaction can only abort
            assert await consumer.committed(tp) == 7
    finally:
        await consumer.stop()


class ConsumerThread:
    """What `internals.group_member` reads of faust's consumer thread: the aiokafka
    consumer it runs."""

    def __init__(self, consumer: AIOKafkaConsumer) -> None:
        self.consumer = consumer

    def _ensure_consumer(self) -> AIOKafkaConsumer:
        return self.consumer
