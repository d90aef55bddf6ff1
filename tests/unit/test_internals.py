"""Each private member of faust-streaming and aiokafka that app/exactly_once/internals.py names is
still there and still does what we rely on, in the installed versions. No broker:
the app's real consumer and producer classes, with fakes where they would connect."""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import suppress
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar, cast
from unittest.mock import AsyncMock

import faust
import faust.assignor
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.client import AIOKafkaClient, CoordinationType
from aiokafka.consumer import fetcher as fetcher_module
from aiokafka.consumer.fetcher import Fetcher, FetchResult
from aiokafka.consumer.group_coordinator import CoordinatorGroupRebalance, GroupCoordinator
from aiokafka.consumer.subscription_state import SubscriptionState
from aiokafka.errors import (
    ConcurrentTransactions,
    IllegalGenerationError,
    ProducerFenced,
    UnknownError,
)
from aiokafka.producer import sender as aiokafka_sender
from aiokafka.producer.sender import AddPartitionsToTxnHandler, Sender
from aiokafka.producer.transaction_manager import TransactionState
from aiokafka.protocol.commit import OffsetFetchRequest
from aiokafka.protocol.group import LeaveGroupRequest, LeaveGroupRequest_v0
from aiokafka.protocol.transaction import AddPartitionsToTxnResponse_v0
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import ConsumerRecord, OffsetAndMetadata, TopicPartition
from faust.exceptions import ConsumerNotStarted
from faust.tables import TableManager
from faust.transport.conductor import ConductorCompiler
from faust.transport.consumer import ThreadDelegateConsumer
from faust.types import TP, Message
from mode.services import ServiceTask
from mode.utils.queues import FlowControlEvent, ThrowableQueue

from app.exactly_once import commit, internals
from app.exactly_once import consumer as consumer_module
from app.exactly_once.application import PairstreamApp, PairstreamTableManager
from app.exactly_once.consumer import ExactlyOnceConsumer, ExactlyOnceConsumerThread
from app.exactly_once.flow_queue import RebalanceSafeQueue, ResumeKeepsFetchedFlowControl
from app.exactly_once.input_partitions import InputSizedAssignor
from app.exactly_once.internals import producer as producer_internals
from app.exactly_once.outbox import partition_transactional_id
from app.exactly_once.partition_tasks import PartitionTasks
from app.exactly_once.transport import (
    CONCURRENT_TRANSACTIONS_RETRY_SECONDS,
    RETRY_BACKOFF_MS,
    ConcurrentTransactionManager,
    ExactlyOnceProducer,
)
from app.faust_app import app
from app.kafka.offset_fetch import OffsetFetchRequest_v7, OffsetFetchResponse_v7
from app.kafka.txn_offset_commit import (
    GroupMember,
    MemberTxnOffsetCommitRequest,
    TxnOffsetCommitRequest_v3,
    TxnOffsetCommitResponse_v3,
)
from app.settings import settings
from app.worker import PairstreamWorker
from tables.pairing_state import table
from tests.unit.conftest import FakeTransactionalProducer, Transactions
from tests.unit.unstarted_producer import producer_knowing

OURS: list[type] = [
    ConcurrentTransactionManager,
    ExactlyOnceConsumer,
    ExactlyOnceConsumerThread,
    ExactlyOnceProducer,
    InputSizedAssignor,
    PairstreamApp,
    PairstreamTableManager,
    PairstreamWorker,
    ResumeKeepsFetchedFlowControl,
]


def overriding(base: type) -> type:
    [ours] = [cls for cls in OURS if issubclass(cls, base)]
    return ours


@pytest.mark.parametrize(
    ("base", "name", "parameters"),
    [(b, n, p) for b, methods in internals.OVERRIDDEN.items() for n, p in methods.items()],
)
def test_each_overridden_method_exists_with_the_parameters_we_take(
    base: type, name: str, parameters: tuple[str, ...]
) -> None:
    member = getattr(base, name)
    theirs = inspect.signature(getattr(member, "fun", member))  # a Service.task wraps it
    assert tuple(theirs.parameters)[: len(parameters)] == parameters
    assert name in overriding(base).__dict__, f"{name} is listed but not overridden"


def test_our_periodic_commit_replaces_faust_s() -> None:
    # Both would run if faust renamed its task: commits off the clock, twice as many.
    ours = ExactlyOnceConsumer.__dict__["_commit_handler"]
    assert isinstance(ours, ServiceTask)
    commit_tasks = [t for t in app.consumer._get_tasks() if t.fun.__name__ == "_commit_handler"]
    assert commit_tasks == [ours]
    assert isinstance(faust.transport.consumer.Consumer.__dict__["_commit_handler"], ServiceTask)


def test_our_table_manager_starts_as_faust_s_does_without_its_wait() -> None:
    """faust's `TableManager.on_start` is the one-second sleep, then what ours does: if
    faust's start changes, ours may leave something out."""

    def body(method: Any) -> list[str]:
        code = [line.strip() for line in inspect.getsource(method).splitlines()[1:]]
        return [line for line in code if line and not line.startswith(("#", '"""'))]

    assert body(TableManager.on_start) == [
        "await self.sleep(1.0)",
        "if not self.should_stop:",
        "await self._update_channels()",
        "await self.recovery.start()",
    ]
    assert body(PairstreamTableManager.on_start) == [
        "if not self.should_stop:",
        "await changelogs_ready(self)",
        "await internals.take_tables_on(self)",
        "await self.recovery.start()",
    ]
    assert body(internals.take_tables_on)[-1] == "await manager._update_channels()"
    assert isinstance(app.tables, PairstreamTableManager)


def test_every_override_is_listed() -> None:
    for ours in OURS:
        [base] = [b for b in internals.OVERRIDDEN if issubclass(ours, b)]
        overridden = {n for n in ours.__dict__ if callable(getattr(base, n, None))}
        overridden -= {"__init__"}
        assert overridden <= set(internals.OVERRIDDEN[base]), ours


def test_committed_offset_reads_what_faust_commits_from() -> None:
    tp = TP("internals", 0)
    assert internals.committed_offset(app.consumer, tp) is None
    app.consumer._committed_offset[tp] = 41
    assert internals.committed_offset(app.consumer, tp) == 41


def test_forget_unacked_takes_a_tracked_message_out_of_flight() -> None:
    message = Message("internals", 1, 7, 0.0, 0, {}, b"k", b"v", None)
    app.consumer.track_message(message)  # what faust does before a stream sees it
    assert message in app.consumer._unacked_messages
    internals.forget_unacked(app.consumer, message)
    assert message.acked and message not in app.consumer._unacked_messages


def test_client_consumer_is_the_thread_s_aiokafka_consumer() -> None:
    thread = app.consumer._new_consumer_thread()
    with pytest.raises(ConsumerNotStarted):
        internals.client_consumer(thread)
    client = object()
    thread._consumer = client
    assert internals.client_consumer(thread) is client


async def test_refreshed_partitions_asks_the_broker_on_the_consumer_thread() -> None:
    thread = app.consumer._new_consumer_thread()
    asked: list[str] = []
    partitions = {"events": {0, 1, 2}}

    async def force_metadata_update() -> bool:
        asked.append("metadata")
        partitions["events"] = set(range(8))
        return True

    async def call_thread(fun: Callable[[], Awaitable[Any]]) -> Any:
        asked.append("thread")
        return await fun()

    client = SimpleNamespace(force_metadata_update=force_metadata_update)
    thread._consumer = SimpleNamespace(_client=client, partitions_for_topic=partitions.get)
    thread.call_thread = call_thread  # type: ignore[method-assign]
    consumer = SimpleNamespace(_thread=thread)
    assert await internals.refreshed_partitions(consumer, "events") == 8
    assert await internals.refreshed_partitions(consumer, "other") is None
    assert asked == ["thread", "metadata"] * 2
    # The members named, as they are: faust's consumer runs its thread as `_thread`;
    # aiokafka's consumer answers partitions_for_topic from its client's cluster, which
    # a forced update refreshes, and its coordinator joins the group again when the
    # leader sees a subscribed topic's partitions change.
    assert isinstance(app.consumer._thread, type(thread))
    assert inspect.iscoroutinefunction(type(thread).call_thread)
    assert "force_metadata_update" in AIOKafkaClient.__dict__
    assert "self._client.cluster.partitions_for_topic(topic)" in inspect.getsource(
        AIOKafkaConsumer.partitions_for_topic
    )
    assert "self._on_metadata_change()" in inspect.getsource(
        GroupCoordinator._handle_metadata_update
    )


def test_the_assignor_is_ours_and_sees_the_cluster_as_partitions_for_topic() -> None:
    assert isinstance(app.assignor, InputSizedAssignor)
    source = inspect.getsource(faust.assignor.PartitionAssignor._perform_assignment)
    source += inspect.getsource(faust.assignor.PartitionAssignor._get_copartitioned_groups)
    # capped metadata answers partitions_for_topic only: faust's assignment asks nothing else.
    assert "cluster.partitions_for_topic(topic)" in source
    assert source.count("cluster.") == 1


def test_is_changelog_knows_the_tables_changelogs() -> None:
    changelog = table.changelog_topic.get_topic_name()
    assert internals.is_changelog(app.consumer, TP(changelog, 0))
    assert not internals.is_changelog(app.consumer, TP("events", 0))


async def test_transaction_producer_is_the_one_faust_began_the_transaction_on(
    transactions: Transactions,
) -> None:
    tid = "internals-test-0"
    assert internals.transaction_producer(tid) is None
    fake = await transactions.begin(tid)
    found = internals.transaction_producer(tid)
    assert found is not None and found[0] is fake and fake.began == 1
    assert isinstance(found[1], asyncio.Lock)


async def test_the_worker_s_consumer_fetches_with_our_limits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Not faust's fixed wait, nor aiokafka's default size (1, our default too)
    limits = settings().model_copy(update={"fetch_max_wait_seconds": 0.2, "fetch_min_bytes": 4096})
    monkeypatch.setattr(consumer_module, "settings", lambda: limits)
    thread: Any = app.consumer._new_consumer_thread()
    consumer = thread._create_worker_consumer(app.transport)
    assert consumer._fetch_max_wait_ms == 200
    assert consumer._fetch_min_bytes == 4096
    # aiokafka reads them when it starts, into the fetcher that builds each fetch request
    started = inspect.getsource(AIOKafkaConsumer.start)
    assert "fetch_max_wait_ms=self._fetch_max_wait_ms" in started
    assert "fetch_min_bytes=self._fetch_min_bytes" in started


class CoordinatorConnection:
    """A connection to the group's coordinator, negotiated up to OffsetFetch version 9
    (Kafka 4.1), that answers offset look-ups in turn and keeps what was sent."""

    def __init__(self, answers: list[OffsetFetchResponse_v7]) -> None:
        self.answers = answers
        self.sent: list[Any] = []

    def send(self, request: Any, expect_response: bool = True) -> asyncio.Future[Any]:
        struct = request.prepare({OffsetFetchRequest_v7.API_KEY: (1, 9)})
        struct.encode()  # as the connection does: the schema must take the values
        self.sent.append(struct)
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        answer.set_result(self.answers[len(self.sent) - 1])
        return answer


def offsets_answer(partition_code: int, group_code: int = 0) -> OffsetFetchResponse_v7:
    partitions = [] if group_code else [(3, 5186, -1, "", partition_code, {})]
    return OffsetFetchResponse_v7(0, [("events", partitions, {})], group_code, {})


# 14, 15, 16: the group's coordinator loading, not available, not this broker (a
# group-level error, no partitions); 88: the partition's offsets not visible yet.
@pytest.mark.parametrize("first", [offsets_answer(0, 14), offsets_answer(0, 15),
                                   offsets_answer(0, 16), offsets_answer(88)])  # fmt: skip
async def test_a_look_up_that_cannot_be_answered_yet_is_retried(
    first: OffsetFetchResponse_v7,
) -> None:
    """aiokafka's look-up of committed offsets, through the worker's consumer's client,
    goes out as OffsetFetch version 7 with require_stable. Without the check, aiokafka
    returns "nothing committed" from a group-level error (faust then seeks to the start
    after a broker bounce), and, asking at version 3, offsets of the transaction before
    one whose markers are still being written."""
    thread: Any = app.consumer._new_consumer_thread()
    consumer = thread._create_worker_consumer(app.transport)
    client = consumer._client
    tp = TopicPartition("events", 3)
    connection = CoordinatorConnection([first, offsets_answer(0)])
    client._get_conn = AsyncMock(return_value=connection)
    client._conns = defaultdict(lambda: connection)
    client.coordinator_lookup = AsyncMock(return_value=0)
    coordinator = GroupCoordinator(client, SubscriptionState(), group_id="g", retry_backoff_ms=1)
    coordinator._coordination_task.cancel()  # no join: only the look-up is under test
    coordinator.coordinator_id = 0

    committed = await coordinator.fetch_committed_offsets([tp])

    assert {tp: c.offset for tp, c in committed.items()} == {tp: 5186}
    assert len(connection.sent) == 2
    for struct in connection.sent:
        assert (struct.API_VERSION, struct.group_id, struct.require_stable) == (7, "g", True)
        assert struct.topics == [("events", [3], {})]


def test_offset_look_ups_are_built_from_aiokafka_s_request() -> None:
    """The members `stable_offset_look_ups` reads off aiokafka's OffsetFetchRequest."""
    request = OffsetFetchRequest("g", [("events", [0, 3])])
    assert (request._consumer_group, request._partitions) == ("g", [("events", [0, 3])])


async def test_the_transactional_producers_of_an_assignment_start_together(
    monkeypatch: pytest.MonkeyPatch, own_tasks: PartitionTasks
) -> None:
    starting: set[str] = set()
    together: list[int] = []

    class SlowToStart(FakeTransactionalProducer):
        def __init__(self, tid: str) -> None:
            super().__init__()
            self.tid = tid

        async def start(self) -> None:
            starting.add(self.tid)
            together.append(len(starting))
            await asyncio.sleep(0.05)  # an InitProducerId that aborts a dead producer's
            starting.discard(self.tid)

    producer: Any = app.producer
    monkeypatch.setattr(producer, "_new_producer", lambda **kw: SlowToStart(kw["transactional_id"]))
    monkeypatch.setattr(producer, "_ensure_producer", lambda: None)
    tids = [f"internals-concurrent-{i}" for i in (3, 1, 4, 0, 2)]
    manager = app.consumer.transactions
    assert isinstance(manager, ConcurrentTransactionManager)
    try:
        await manager._start_transactions(tids)
        assert max(together) == len(tids)
        assert all(producer._transaction_producers[t].began == 1 for t in tids)
        # The worker's one transaction: the first of them, whichever order they came in.
        assert own_tasks.transactional_id == "internals-concurrent-0"
        await manager._stop_transactions(["internals-concurrent-3"])
        assert own_tasks.transactional_id == "internals-concurrent-0"
        await manager._stop_transactions(["internals-concurrent-0"])
        assert own_tasks.transactional_id is None
    finally:
        for tid in tids:
            producer._transaction_producers.pop(tid, None)
            producer._trn_locks.pop(tid, None)


async def test_a_transactional_producer_whose_sender_fails_crashes_the_worker(
    monkeypatch: pytest.MonkeyPatch, own_tasks: PartitionTasks
) -> None:
    """aiokafka's sender routine ends on an error it does not expect (UNKNOWN_SERVER_ERROR
    to TxnOffsetCommit, seen after a broker's hard bounce); a commit waiting on the
    transaction then waited for ever. So does a produce retry when the client's metadata
    synchronizer has ended. The worker crashes instead, once per task."""
    crashes: list[BaseException] = []

    async def crash(reason: BaseException) -> None:
        crashes.append(reason)

    monkeypatch.setattr(app, "crash", crash)
    monkeypatch.setattr(app, "add_future", asyncio.ensure_future)
    transactions = Transactions(monkeypatch)
    tids = ["internals-sender-0", "internals-sender-1"]
    manager = app.consumer.transactions
    assert isinstance(manager, ConcurrentTransactionManager)
    try:
        fakes = [await transactions.begin(tid) for tid in tids]
        await manager._start_transactions(tids)  # begun already: only watched
        await manager._start_transactions(tids)  # a second assignment: watched once
        fakes[0]._sender.sender_task.cancel()  # a producer stopped: no crash
        fakes[0].client._sync_task.cancel()
        fakes[1]._sender.sender_task.set_exception(UnknownError())
        fakes[1].client._sync_task.set_exception(KeyError("metadata"))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert sorted(type(c).__name__ for c in crashes) == ["KeyError", "UnknownError"]
    finally:
        for tid in tids:
            app.producer._transaction_producers.pop(tid, None)  # type: ignore[attr-defined]
            app.producer._trn_locks.pop(tid, None)  # type: ignore[attr-defined]


async def test_a_commit_not_ended_after_the_transaction_timeout_crashes_the_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    crashes: list[BaseException] = []

    async def crash(reason: BaseException) -> None:
        crashes.append(reason)

    async def hangs(*args: Any, **kwargs: Any) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(app, "crash", crash)
    monkeypatch.setattr(app.producer, "commit_transactions", hangs)
    monkeypatch.setattr(app.partition_tasks, "transactional_id", "internals-hangs")
    short = settings().model_copy(update={"transaction_timeout_seconds": 0.05})
    monkeypatch.setattr(commit, "settings", lambda: short)
    manager = app.consumer.transactions
    assert isinstance(manager, ConcurrentTransactionManager)
    assert await asyncio.wait_for(manager.commit({TP("events", 0): 7}), 5) is False
    assert [type(c) for c in crashes] == [TimeoutError]


async def test_metadata_task_is_the_task_of_aiokafka_s_metadata_synchronizer() -> None:
    producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:1")
    assert internals.metadata_task(producer) is None  # before its start
    assert "self._sync_task = create_task(self._md_synchronizer())" in inspect.getsource(
        AIOKafkaClient.bootstrap
    )


async def test_sender_task_is_the_task_of_aiokafka_s_sender_routine() -> None:
    producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:1")
    assert internals.sender_task(producer) is None  # before its start
    assert "self._sender_task = create_task(self._sender_routine())" in inspect.getsource(
        Sender.start
    )


async def test_each_input_partition_has_a_transactional_producer_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # So that the next owner of any partition aborts its previous owner's open transaction
    # at once. faust names a producer by the partition's topic group; two stages' topics
    # with the same partition count would share one, and the next owner of pairing's
    # partition 0 would not fence a worker whose transaction had ingest's partition 0's id.
    started: list[str] = []

    async def start(_: Any, tids: list[str]) -> None:
        started.extend(tids)

    monkeypatch.setattr(ConcurrentTransactionManager, "_start_transactions", start)
    monkeypatch.setattr(app.assignor, "group_for_topic", lambda topic: 0)  # one group
    monkeypatch.setattr(app.assignor, "is_standby", lambda tp: False)
    tps = {TP("events", 0), TP("keyed", 0), TP("events", 1)}
    await app.consumer.transactions.on_rebalance(tps, set(), tps)
    assert sorted(started) == sorted(partition_transactional_id(app, tp) for tp in tps)
    assert len(set(started)) == len(tps)


class Committing(FakeTransactionalProducer):
    """Records the transactions it commits; the one named `fenced` fails, and every one
    while the group has moved on without its member (`not_a_member`)."""

    committed: ClassVar[list[str]] = []
    fenced: ClassVar[str] = ""
    not_a_member: ClassVar[Exception | None] = None

    def __init__(self, tid: str) -> None:
        super().__init__()
        self.tid = tid

    async def send_offsets_to_transaction(self, offsets: Any, group_id: str) -> None:
        if self.not_a_member is not None:
            raise self.not_a_member
        # aiokafka's own check (commit_structure_validate) takes its TopicPartition only.
        assert all(type(tp) is TopicPartition for tp in offsets)

    async def commit_transaction(self) -> None:
        if self.tid == self.fenced:
            raise ProducerFenced()
        self.committed.append(self.tid)


@pytest.fixture
def committing(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[list[str]], Awaitable[None]]]:
    """Begins transactions on `Committing` producers through faust's own producer."""
    producer: Any = app.producer
    monkeypatch.setattr(producer, "_new_producer", lambda **kw: Committing(kw["transactional_id"]))
    monkeypatch.setattr(producer, "_ensure_producer", lambda: None)
    began: list[str] = []

    async def begin(tids: list[str]) -> None:
        for tid in tids:
            await producer.begin_transaction(tid)
            began.append(tid)

    yield begin
    Committing.committed.clear()
    Committing.fenced = ""
    Committing.not_a_member = None
    for tid in began:
        producer._transaction_producers.pop(tid, None)
        producer._trn_locks.pop(tid, None)


async def test_a_fenced_commit_crashes_the_worker_and_is_not_taken_for_a_commit(
    committing: Callable[[list[str]], Awaitable[None]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # faust's own TransactionManager.commit answers True here, and the consumer then
    # hands the fenced transaction's writes to local state (docs/exactly-once.md).
    crashes: list[BaseException] = []

    async def crash(reason: BaseException) -> None:
        crashes.append(reason)

    monkeypatch.setattr(app, "crash", crash)
    tps = [TP("events", 0), TP("events", 1)]  # faust's, which aiokafka does not take
    tid = partition_transactional_id(app, tps[0])
    monkeypatch.setattr(app.partition_tasks, "transactional_id", tid)
    await committing([tid])
    manager = app.consumer.transactions
    assert await manager.commit(dict.fromkeys(tps, 10)) is True
    assert Committing.committed == [tid]  # one transaction for both partitions
    assert not crashes
    Committing.fenced = tid
    assert await manager.commit(dict.fromkeys(tps, 20)) is False
    Committing.fenced = ""
    Committing.not_a_member = IllegalGenerationError()  # the group moved on without it
    assert await manager.commit(dict.fromkeys(tps, 30)) is False
    assert [type(c) for c in crashes] == [ProducerFenced, IllegalGenerationError]


def test_restore_offsets_reads_the_recovery_s_progress() -> None:
    recovery: Any = app.tables.recovery
    tp = TP(table.changelog_topic.get_topic_name(), 3)
    assert internals.restore_offsets(recovery, tp) == (None, None)
    recovery.active_offsets[tp] = 9
    recovery.active_highwaters[tp] = 12
    try:
        assert internals.restore_offsets(recovery, tp) == (9, 12)
    finally:
        del recovery.active_offsets[tp], recovery.active_highwaters[tp]


def test_the_worker_leaves_the_root_logger_at_the_level_asked_for() -> None:
    logger = logging.getLogger("pairstream-test-root")
    logger.addHandler(logging.NullHandler())
    logger.setLevel(logging.WARNING)
    worker = app.conf.Worker(app, loglevel="warn")
    assert isinstance(worker, PairstreamWorker)
    assert worker.spinner is not None  # faust made one: it would set DEBUG below
    worker.on_setup_root_logger(logger, logging.WARNING)
    assert logger.level == logging.WARNING and len(logger.handlers) == 1


def unconnected_consumer(callback: Callable[..., Awaitable[None]]) -> Any:
    """The app's consumer class, never started: its fetcher and seeks replaced by fakes."""
    return ExactlyOnceConsumer(
        app.transport,
        callback=callback,
        on_partitions_revoked=None,
        on_partitions_assigned=None,
        loop=asyncio.get_running_loop(),
    )


async def _fetched_around_a_seek_back(read: Any) -> list[int]:
    """Runs faust's own fetcher loop over two fetches of a partition: a record (10)
    fetched before a seek back to 5, which the agent receives, skips and seeks back
    from before the fetcher has finished handing it on; then what the seek fetches
    (5..10). Returns the offsets the fetcher handed on."""
    tp = TP("events", 0)
    fetcher = SimpleNamespace(_stopped=asyncio.Event())
    fetches = [[10], [5, 6, 7, 8, 9, 10]]
    handed: list[int] = []

    async def getmany(timeout: float) -> AsyncIterator[tuple[TP, Message]]:
        batch = fetches.pop(0)
        if not fetches:
            fetcher._stopped.set()
        for offset in batch:
            yield tp, Message(tp.topic, tp.partition, offset, 0.0, 0, {}, b"k", b"v", None)

    async def callback(message: Message) -> None:
        handed.append(message.offset)
        if message.offset == 10 and len(handed) == 1:  # the agent's seek back
            read[tp] = 5
            if isinstance(read, internals.LastReadOffsets):
                read.hold(tp, 5)

    consumer = unconnected_consumer(callback)
    consumer._read_offset = read
    consumer.getmany = getmany
    await consumer._drain_messages(fetcher)
    return handed


async def test_faust_s_fetcher_sets_the_last_read_offset_after_handing_a_record_on() -> None:
    # Why LastReadOffsets exists: over a plain mapping the seek back is undone and
    # only the skipped record comes again.
    plain: defaultdict[TP, int | None] = defaultdict(lambda: None)
    assert await _fetched_around_a_seek_back(plain) == [10, 10]


async def test_a_held_seek_back_fetches_again_from_the_sought_offset() -> None:
    read = internals.LastReadOffsets()
    assert await _fetched_around_a_seek_back(read) == [10, 5, 6, 7, 8, 9, 10]
    assert read[TP("events", 0)] == 10 and not read.holds  # released by record 5


async def _drain_one_fetch(
    callback: Callable[[Message], Awaitable[None]], offsets: list[int], consumer: Any = None
) -> Any:
    """faust's own fetcher loop over one fetch of `offsets` from one partition."""
    tp = TP("events", 0)
    fetcher = SimpleNamespace(_stopped=asyncio.Event())

    async def getmany(timeout: float) -> AsyncIterator[tuple[TP, Message]]:
        fetcher._stopped.set()
        for offset in offsets:
            yield tp, Message(tp.topic, tp.partition, offset, 0.0, 0, {}, b"k", b"v", None)

    consumer = consumer or unconnected_consumer(callback)
    consumer.getmany = getmany
    await consumer._drain_messages(fetcher)
    return consumer


async def test_faust_s_fetcher_hands_a_record_over_in_its_own_task_when_it_need_not_wait() -> None:
    # faust races each hand-over, as a task of its own, against the flow's suspension
    # (`wait_first`); ours runs it in the fetcher's task unless it has to wait.
    fetching = asyncio.current_task()
    ran_in: list[tuple[int, bool]] = []

    async def callback(message: Message) -> None:
        ran_in.append((message.offset, asyncio.current_task() is fetching))

    consumer = await _drain_one_fetch(callback, [1, 2, 3])
    assert ran_in == [(1, True), (2, True), (3, True)]
    assert consumer._read_offset[TP("events", 0)] == 3


async def test_the_fetcher_lets_other_tasks_run_between_two_records() -> None:
    # A commit's round trips wait for turns of the event loop: a fetch handed over in
    # one go made them wait for all of it.
    turns: list[object] = []

    async def other_task() -> None:
        while True:
            turns.append("turn")
            await asyncio.sleep(0)

    async def callback(message: Message) -> None:
        turns.append(message.offset)

    other = asyncio.ensure_future(other_task())
    await asyncio.sleep(0)
    await _drain_one_fetch(callback, [1, 2, 3])
    other.cancel()
    at = [turns.index(offset) for offset in (1, 2, 3)]
    assert all(later - earlier > 1 for earlier, later in itertools.pairwise(at)), turns


async def test_a_hand_over_that_waits_finishes_before_the_next_record_is_handed_over() -> None:
    handed: list[str] = []

    async def callback(message: Message) -> None:
        handed.append(f"{message.offset} in")
        if message.offset == 2:  # the agent's queue is full for a moment
            await asyncio.sleep(0.01)
        handed.append(f"{message.offset} out")

    await _drain_one_fetch(callback, [1, 2, 3])
    assert handed == ["1 in", "1 out", "2 in", "2 out", "3 in", "3 out"]


async def test_a_waiting_hand_over_is_dropped_when_the_flow_is_suspended() -> None:
    # As in faust: a rebalance suspends the flow; a hand-over still waiting then is
    # cancelled, and the partition is fetched again from its committed offset.
    handed: list[str] = []
    consumer: Any = None

    async def callback(message: Message) -> None:
        try:
            if message.offset == 2:
                asyncio.get_running_loop().call_later(0.01, consumer.suspend_flow.set)
                await asyncio.Event().wait()
            handed.append(f"{message.offset}")
        except asyncio.CancelledError:
            handed.append(f"{message.offset} cancelled")
            raise

    consumer = unconnected_consumer(callback)
    await _drain_one_fetch(callback, [1, 2, 3], consumer)
    # 3 goes faust's way while the flow is suspended: raced against the set flag.
    assert handed[:2] == ["1", "2 cancelled"]


async def _loop_turns(turns: int) -> None:
    """Lets the tasks that are ready run, for so many turns of the event loop (not for
    so long: nothing here waits on I/O)."""
    for _ in range(turns):
        await asyncio.sleep(0)


async def _restored_after_a_rebalance(queue_class: type[ThrowableQueue[Any]]) -> list[int]:
    """faust's own hand-over of fetched records (the conductor's handler) into a
    restore's changelog queue of one place, around a rebalance: a record (19425) is
    handed over while the queue is full, and the rebalance suspends the flow before
    the put faust starts for it has run; the restore then resumes the flow and the
    fetch brings 17385.. again. Returns the offsets the restore reads, in order."""
    tp = TP("restored-changelog", 0)
    flow = FlowControlEvent()  # the app's, which its queues and handlers share
    flow.resume()
    queue = queue_class(1, flow_control=flow, clear_on_resume=True)
    channel = faust.Topic(app, topics=[tp.topic], key_type=bytes, value_type=bytes)
    channel = channel.clone_using_queue(queue)
    hand_over = ConductorCompiler().build(app.topics, tp, {channel})

    def record(offset: int) -> Message:
        return Message(tp.topic, tp.partition, offset, 0.0, 0, {}, b"k", b"v", None)

    app_flow_was_active = app.flow_control.is_active()
    app.flow_control.resume()  # the handler's own wait for the flow: passed at once
    try:
        await hand_over(record(17384))
        waiting = asyncio.ensure_future(hand_over(record(19425)))
        await asyncio.sleep(0)  # finds the queue full: starts a put of its own
        flow.suspend()  # the rebalance, as faust's `_on_partitions_revoked`...
        waiting.cancel()  # ...whose suspension of the consumer's flow cancels this
        flow.clear()
        await asyncio.sleep(0)  # the put task waits for the flow
        flow.resume()  # the restore, after its seek
        read: list[int] = []

        async def restore() -> None:
            while True:
                read.append((await queue.get()).message.offset)

        restoring = asyncio.ensure_future(restore())
        await _loop_turns(50)  # the fetch's round trip
        for offset in range(17385, 17390):
            await hand_over(record(offset))
        await _loop_turns(50)
        restoring.cancel()
        return read
    finally:
        if not app_flow_was_active:
            app.flow_control.suspend()


async def test_a_put_left_waiting_by_a_rebalance_lands_ahead_of_the_restore_s_fetch() -> None:
    # Why RebalanceSafeQueue exists: faust's restore keeps the highest offset it has
    # read and drops records at or below it, so 17385..19424 would be lost.
    read = await _restored_after_a_rebalance(ThrowableQueue)
    assert read == [19425, *range(17385, 17390)]


async def test_a_put_left_waiting_by_a_rebalance_is_dropped() -> None:
    assert await _restored_after_a_rebalance(RebalanceSafeQueue) == list(range(17385, 17390))


def test_the_app_s_fetch_buffers_drop_puts_left_waiting_by_a_rebalance() -> None:
    assert type(app.FlowControlQueue(maxsize=4, clear_on_resume=True)) is RebalanceSafeQueue
    assert type(app.tables.changelog_queue) is RebalanceSafeQueue


async def _kept_through_resumes(flow: FlowControlEvent) -> tuple[int, int]:
    """A standby's buffer with 3 fetched records: how many it holds after a resume while
    the flow runs (as faust's recovery calls it), then after a suspend and a resume."""
    flow.resume()
    queue: RebalanceSafeQueue[int] = RebalanceSafeQueue(flow_control=flow, clear_on_resume=True)
    for offset in (5475, 5476, 5477):
        await queue.put(offset)
    flow.resume()
    kept = queue.qsize()
    flow.suspend()
    flow.resume()
    return kept, queue.qsize()


async def test_mode_s_resume_clears_the_buffers_while_the_flow_runs() -> None:
    # Why ResumeKeepsFetchedFlowControl exists (docs/faust-gaps.md, 30).
    assert await _kept_through_resumes(FlowControlEvent()) == (0, 0)


async def test_our_resume_keeps_fetched_records_unless_it_ends_a_suspension() -> None:
    assert await _kept_through_resumes(ResumeKeepsFetchedFlowControl()) == (3, 0)


def test_the_app_s_buffers_are_managed_by_our_flow_control() -> None:
    assert type(app.flow_control) is ResumeKeepsFetchedFlowControl
    assert "flow_control" in faust.App.__dict__ and "flow_control" in PairstreamApp.__dict__
    assert app.tables.changelog_queue.flow is app.flow_control


def test_a_hold_is_released_by_the_record_after_a_sought_transaction_marker() -> None:
    tp, other = TP("events", 0), TP("events", 1)
    read = internals.LastReadOffsets()
    read.hold(tp, 5)
    read[other] = 40  # other partitions are not held
    read[tp] = 12
    assert read[tp] == 5 and read[other] == 40
    read[tp] = 6
    assert read[tp] == 6 and not read.holds
    read[tp] = 12
    assert read[tp] == 12


def test_the_consumer_s_last_read_offsets_are_the_held_kind() -> None:
    consumer: Any = app.consumer
    assert consumer._read_offset is consumer.last_read
    assert isinstance(consumer.last_read, internals.LastReadOffsets)


async def test_stream_partitions_without_a_committed_offset_are_sought_to_their_start() -> None:
    # faust's seek to committed offsets leaves them where an earlier fetch left them,
    # its records dropped during the restore and never delivered.
    changelog = TP(table.changelog_topic.get_topic_name(), 0)
    committed = {TP("events", 0): 12, TP("events", 1): None, TP("events", 2): 0, changelog: None}
    sought: dict[TP, int] = {}

    async def seek_to_committed() -> dict[TP, int | None]:
        for tp, offset in committed.items():
            if offset:
                sought[tp] = offset
        return committed

    async def seek(tp: TP, offset: int) -> None:
        sought[tp] = offset

    consumer = unconnected_consumer(seek)
    consumer.assignment = lambda: set(committed)
    consumer.seek_to_committed = seek_to_committed
    consumer._seek = seek
    await consumer.perform_seek()
    assert sought == {TP("events", 0): 12, TP("events", 1): 0, TP("events", 2): 0}


def test_local_partition_is_the_database_faust_reads_and_restores_from(tmp_path: Path) -> None:
    other = faust.App("internals-local-partition", datadir=str(tmp_path), store="rocksdb://")
    state = other.Table(
        "state", partitions=2, key_type=bytes, value_type=bytes, options={"driver": "rocksdict"}
    )
    changelog = TP(state.changelog_topic.get_topic_name(), 1)
    batch = internals.local_write_batch()
    batch.put(b"key", b"value")
    batch.put(state.data.offset_key, b"17")
    internals.local_partition(state, 1).write(batch)
    assert state.data.get(b"key") == b"value"  # faust finds it, outside any event
    assert state.data.persisted_offset(changelog) == 17  # where its restore starts
    assert state.data.persisted_offset(TP(changelog.topic, 0)) is None


async def test_group_member_id_is_the_one_aiokafka_joined_with() -> None:
    consumer = AIOKafkaConsumer(group_id="g", bootstrap_servers="127.0.0.1:1")
    assert internals.group_member_id(consumer) is None  # not started: no coordinator
    consumer._coordinator = SimpleNamespace(member_id="")  # started, not joined yet
    assert internals.group_member_id(consumer) is None
    consumer._coordinator = SimpleNamespace(member_id="faust-1")
    assert internals.group_member_id(consumer) == "faust-1"
    # aiokafka's coordinator keeps the id the broker's join answer gave it there.
    assert "self._coordinator.member_id = response.member_id" in inspect.getsource(
        CoordinatorGroupRebalance
    )


async def test_group_generation_is_aiokafka_s_and_minus_one_until_a_join() -> None:
    thread = app.consumer._new_consumer_thread()
    consumer = SimpleNamespace(_thread=thread)
    assert internals.group_generation(consumer) == -1  # not started: no aiokafka consumer
    client = AIOKafkaConsumer(group_id="g", bootstrap_servers="127.0.0.1:1")
    thread._consumer = client
    assert internals.group_generation(consumer) == -1  # no coordinator yet
    client._coordinator = SimpleNamespace(generation=-1)  # started, not joined
    assert internals.group_generation(consumer) == -1
    client._coordinator = SimpleNamespace(generation=4)
    assert internals.group_generation(consumer) == 4
    assert "self._coordinator.generation = response.generation_id" in inspect.getsource(
        CoordinatorGroupRebalance
    )


def test_remove_group_member_uses_aiokafka_s_client_as_it_is() -> None:
    """The calls `remove_group_member` makes of aiokafka's client (broker behaviour:
    tests/integration/test_kafka_admin.py)."""
    lookup = inspect.signature(AIOKafkaClient.coordinator_lookup)
    assert list(lookup.parameters) == ["self", "coordinator_type", "coordinator_key"]
    assert list(inspect.signature(AIOKafkaClient.send).parameters)[:3] == [
        "self",
        "node_id",
        "request",
    ]
    assert CoordinationType.GROUP == 0
    built = LeaveGroupRequest("group", "member-1").build(LeaveGroupRequest_v0)
    assert (built.group, built.member_id) == ("group", "member-1")


class _Prefetched:
    """What aiokafka's fetcher keeps per partition, for its own `fetched_records` to
    read: a real `FetchResult` over records of one partition, its position tracked."""

    def __init__(self, tp: TP, offsets: range) -> None:
        self.position = offsets.start
        self.paused = False
        records = iter([SimpleNamespace(offset=o) for o in offsets])
        state = self

        class Records:
            next_fetch_offset = offsets.start

            def __iter__(self) -> Iterator[Any]:
                for record in records:
                    Records.next_fetch_offset = record.offset + 1
                    yield record

        self.result = FetchResult(
            tp,
            assignment=SimpleNamespace(active=True, state_value=lambda _tp: state),
            partition_records=Records(),
            backoff=0,
        )

    def consumed_to(self, offset: int) -> None:
        self.position = offset


async def _fetch_while_a_restore_ends(getmany: Callable[..., Awaitable[Any]]) -> Any:
    """A fetch asked for the active changelog partition; while it waits, the restore
    ends and pauses it, emptying faust's live set of active partitions; then aiokafka's
    own `fetched_records` runs over what it has prefetched: records of that partition
    and of a standby changelog partition that faust has not resumed yet. Returns the
    standby's prefetched state."""
    active, standby = TP("changelog", 0), TP("changelog", 1)
    prefetched = {
        active: _Prefetched(active, range(90, 100)),
        standby: _Prefetched(standby, range(0, 10)),
    }
    fetcher = SimpleNamespace(
        _subscriptions=SimpleNamespace(reassignment_in_progress=False, is_assigned=lambda tp: True),
        _records={tp: p.result for tp, p in prefetched.items()},
        _notify=lambda future: None,
        _wait_consume_future=None,
    )
    live: set[TP] = {active}
    restore_ended = asyncio.Event()

    async def thread_getmany(partitions: set[TP], timeout: float) -> Any:
        await restore_ended.wait()
        return await Fetcher.fetched_records(fetcher, partitions, timeout=0)

    consumer = unconnected_consumer(AsyncMock())
    consumer._thread = SimpleNamespace(getmany=thread_getmany)
    fetching = asyncio.ensure_future(getmany(consumer, live, 1.0))
    await asyncio.sleep(0)
    live.clear()  # faust's pause_partitions at the end of the restore
    restore_ended.set()
    returned = await fetching
    return returned, prefetched[standby]


async def test_a_fetch_returns_only_partitions_active_when_it_was_asked_for() -> None:
    # faust passes its live set: emptied while the fetch waits, aiokafka reads it as
    # "every partition" and hands over the standby's records, which faust then drops.
    plain = ThreadDelegateConsumer._getmany
    returned, standby = await _fetch_while_a_restore_ends(plain)
    assert [tp.partition for tp in returned] == [0, 1] and standby.position == 10
    returned, standby = await _fetch_while_a_restore_ends(ExactlyOnceConsumer._getmany)
    assert [tp.partition for tp in returned] == [0] and standby.position == 0


async def test_a_fetch_waits_no_longer_than_a_fetch_waits_at_the_broker() -> None:
    # faust's fetch loop asks with a 1 s wait. A partition whose stream buffer filled is
    # left out of the fetch, and aiokafka fetches nothing new for it while it holds its
    # records, so the wait ran out its second while that buffer drained in milliseconds.
    waits: list[float] = []

    async def thread_getmany(partitions: set[TP], timeout: float) -> Any:
        waits.append(timeout)
        return {}

    consumer = unconnected_consumer(AsyncMock())
    consumer._thread = SimpleNamespace(getmany=thread_getmany)
    await ThreadDelegateConsumer._getmany(consumer, {TP("events", 0)}, 1.0)
    assert await ExactlyOnceConsumer._getmany(consumer, {TP("events", 0)}, 1.0) == {}
    assert await ExactlyOnceConsumer._getmany(consumer, {TP("events", 0)}, 0.001) == {}
    assert waits == [1.0, settings().fetch_max_wait_seconds, 0.001]


async def test_a_quiet_worker_s_fetches_wait_longer_until_a_record_comes() -> None:
    conf = settings()
    waits: list[float] = []
    fetched: list[Any] = []

    async def thread_getmany(partitions: set[TP], timeout: float) -> Any:
        waits.append(timeout)
        return fetched.pop(0)

    consumer = unconnected_consumer(AsyncMock())
    consumer._thread = SimpleNamespace(getmany=thread_getmany)
    at_broker: list[float] = []
    consumer._set_fetch_wait = at_broker.append
    tp = TP("events", 0)
    fetched += [{}, {}]
    await ExactlyOnceConsumer._getmany(consumer, {tp}, 1.0)  # empty, but records came lately
    consumer._records_at -= consumer_module.QUIET_AFTER_SECONDS  # a second without records
    await ExactlyOnceConsumer._getmany(consumer, {tp}, 1.0)
    assert at_broker == [conf.quiet_fetch_max_wait_seconds]
    fetched += [{}, {tp: ["a record"]}, {}]
    for _ in range(3):
        await ExactlyOnceConsumer._getmany(consumer, {tp}, 1.0)
    assert waits == [conf.fetch_max_wait_seconds] * 2 + [conf.quiet_fetch_max_wait_seconds] * 2 + [
        conf.fetch_max_wait_seconds
    ]
    assert at_broker == [conf.quiet_fetch_max_wait_seconds, conf.fetch_max_wait_seconds]


def test_set_fetch_wait_sets_what_aiokafka_s_fetcher_builds_each_request_with() -> None:
    fetcher = SimpleNamespace(_fetch_max_wait_ms=10)
    internals.set_fetch_wait(cast(Any, SimpleNamespace(_fetcher=fetcher)), 0.25)
    assert fetcher._fetch_max_wait_ms == 250
    internals.set_fetch_wait(cast(Any, SimpleNamespace(_fetcher=None)), 0.25)  # not started
    assert "self._fetch_max_wait_ms," in inspect.getsource(Fetcher._get_actions_per_node)


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not within the timeout"
        await asyncio.sleep(0.001)


async def test_the_commit_loop_commits_only_after_an_ack(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(app.topics, "acks_enabled_for", lambda topic: True)  # not subscribed
    consumer = unconnected_consumer(AsyncMock())
    commits: list[float] = []

    async def commit() -> bool:
        commits.append(time.monotonic())
        return True

    consumer.commit = commit
    loop = asyncio.create_task(ExactlyOnceConsumer._commit_handler.fun(consumer))
    await asyncio.sleep(0.1)
    assert commits == []  # nothing acked: no commit, however long the wait

    class Message:  # what faust's ack reads of a message, and weakly referable as it needs
        acked, tp, offset, topic = False, TP("events", 0), 7, "events"

    assert ExactlyOnceConsumer.ack(consumer, cast(Any, Message()))
    await until(lambda: len(commits) >= 1)  # woken by the ack, not by a clock
    # Acked and not taken by that commit (here: the fake commits nothing): tried again.
    await until(lambda: len(commits) >= 3)
    assert internals.pending_acks(consumer)
    internals.forget_acks_below(consumer, TP("events", 0), 8)  # what a commit does
    assert not internals.pending_acks(consumer)
    await asyncio.sleep(0.1)  # a commit under way when the acks went may still end
    settled = len(commits)
    await asyncio.sleep(0.2)
    assert len(commits) == settled  # nothing pending: the loop waits for an ack again
    loop.cancel()
    with suppress(asyncio.CancelledError):
        await loop


async def test_keyed_partitioner_chooses_as_aiokafka_s_send_does() -> None:
    producer = producer_knowing({"out": 5})
    choose = internals.keyed_partitioner(producer, "out")
    assert choose is not None
    keys = [b"2024-02-09 21:00:%02d" % s for s in range(60)]
    chosen = [choose(key) for key in keys]
    assert chosen == [producer._partition("out", None, key, None, key, None) for key in keys]
    assert len(set(chosen)) > 1
    assert internals.keyed_partitioner(producer, "unknown") is None
    # A partitioner of the app's own (faust's producer_partitioner) chooses instead.
    producer._partitioner = lambda key, every, available: every[-1]
    own = internals.keyed_partitioner(producer, "out")
    assert own is not None and {own(key) for key in keys} == {4}


async def test_records_appended_to_open_batches_follow_the_one_send_put_there() -> None:
    producer = producer_knowing({"out": 5})
    tp = TopicPartition("out", 2)
    watched: list[asyncio.Future[Any]] = []
    deliveries: list[tuple[asyncio.Future[Any], int]] = []
    records: list[tuple[str, bytes | None, bytes | None, int | None]] = [
        ("out", b"k0", b"v0", 2),
        ("out", b"k2", b"v2", 2),
        ("out", b"k3", b"v3", 2),
        ("out", b"k", b"v", 3),
        ("out", b"k", b"v", 7),  # a partition the producer does not know (yet)
    ]
    accumulator = producer._message_accumulator
    first = await accumulator.add_message(tp, b"k1", b"v1", 5)  # what send ends in
    # From the second record: two appended to that batch, one to a batch opened for
    # partition 3 (and added to the transaction there, as send does); then a stop.
    assert internals.append_to_open_batches(producer, records, 1, deliveries, watched.append) == 4
    (batch,) = accumulator._batches[tp]
    (opened,) = accumulator._batches[TopicPartition("out", 3)]
    assert deliveries == [(batch.future, 1), (batch.future, 2), (opened.future, 0)]
    assert set(watched) == {batch.future, opened.future}
    assert batch.record_count == 3 and opened.record_count == 1
    # send appends after them (the batch builder's record count was kept).
    fourth = await accumulator.add_message(tp, b"k4", b"v4", 5)
    batch.done(base_offset=40)
    assert first.result().offset == 40 and fourth.result().offset == 43
    # The records as the broker will hold them: in order, each once.
    batches = MemoryRecords(bytes(batch.get_data_buffer()))
    built_records = []
    while (built := batches.next_batch()) is not None:
        built_records.extend(built)
    assert [(r.key, r.value) for r in built_records] == [
        (b"k1", b"v1"), (b"k2", b"v2"), (b"k3", b"v3"), (b"k4", b"v4")
    ]  # fmt: skip
    assert [r.offset for r in built_records] == [0, 1, 2, 3]


async def test_a_batch_opened_for_a_step_adds_its_partition_to_the_transaction() -> None:
    producer = producer_knowing({"out": 3}, transactional_id="pairstream-events-0")
    transaction = producer._txn_manager
    transaction.set_pid_and_epoch(1, 0)
    transaction.begin_transaction()
    deliveries: list[tuple[asyncio.Future[Any], int]] = []
    records: list[tuple[str, bytes | None, bytes | None, int | None]] = [("out", b"k", b"v", 2)]
    assert internals.append_to_open_batches(producer, records, 0, deliveries, lambda _: None) == 1
    # As send's batch would: the sender adds it to the transaction before its produce.
    assert transaction.partitions_to_add() == {TopicPartition("out", 2)}
    (batch,) = producer._message_accumulator._batches[TopicPartition("out", 2)]
    built = MemoryRecords(bytes(batch.get_data_buffer())).next_batch()
    assert built is not None and built.is_transactional


async def test_a_full_batch_is_closed_and_the_next_opened_behind_it() -> None:
    producer = producer_knowing({"out": 5})
    tp = TopicPartition("out", 1)
    accumulator = producer._message_accumulator
    await accumulator.add_message(tp, b"k", b"v" * 100, 5)
    (batch,) = accumulator._batches[tp]
    big = b"x" * accumulator._batch_size
    deliveries: list[tuple[asyncio.Future[Any], int]] = []
    records: list[tuple[str, bytes | None, bytes | None, int | None]] = [
        ("out", b"a", b"small", 1),
        ("out", b"b", big, 1),
        ("out", b"c", b"small", 1),
    ]
    assert internals.append_to_open_batches(producer, records, 0, deliveries, lambda _: None) == 3
    # Closed as BatchBuilder.append closes it when full; `send` would have waited for
    # it to be drained before opening the next.
    first, second, third = accumulator._batches[tp]
    assert first is batch and first._builder.closed() and second._builder.closed()
    assert deliveries == [(first.future, 1), (second.future, 0), (third.future, 0)]
    assert [b.record_count for b in (first, second, third)] == [2, 1, 1]


async def test_the_batches_still_gathering_are_closed_and_delivered_before_the_offsets() -> None:
    producer = producer_knowing({"out": 2})
    accumulator = producer._message_accumulator
    gathering = await accumulator.add_message(TopicPartition("out", 1), b"k", b"v", 5)
    (batch,) = accumulator._batches[TopicPartition("out", 1)]
    delivering = asyncio.ensure_future(internals.deliver_gathered_batches(producer))
    await asyncio.sleep(0)
    # Closed at once, not after the linger, and waited for until the sender delivers it.
    assert batch._builder.closed() and not delivering.done()
    # What aiokafka's sender awaits before EndTxn: the same closing and waiting.
    assert "batch._builder.close()" in inspect.getsource(type(accumulator).flush_for_commit)
    assert "flush_for_commit()" in inspect.getsource(Sender._do_txn_commit)
    batch.done(base_offset=7)
    await delivering
    assert (await gathering).offset == 7


async def test_a_transaction_begins_with_the_partitions_the_one_before_wrote() -> None:
    producer = producer_knowing({"out": 3}, transactional_id="pairstream-events-0")
    transaction = producer._txn_manager
    transaction.set_pid_and_epoch(1, 0)
    transaction.begin_transaction()
    out = [TopicPartition("out", p) for p in range(3)]
    transaction.maybe_add_partition_to_txn(out[0])
    transaction.partition_added(out[0])  # the broker's answer to AddPartitionsToTxn
    transaction.maybe_add_partition_to_txn(out[2])  # asked, not answered yet
    written = internals.transaction_partitions(producer)
    assert written == {out[0], out[2]}
    transaction.partition_added(out[2])
    transaction.committing_transaction()
    transaction.complete_transaction()  # the broker's answer to EndTxn
    transaction.begin_transaction()
    assert internals.transaction_partitions(producer) == frozenset()
    internals.add_to_transaction(producer, written)
    # All pending at once: the sender asks for them in one AddPartitionsToTxn.
    assert transaction.partitions_to_add() == {out[0], out[2]}


async def test_no_more_batches_are_opened_behind_those_the_sender_has_not_taken() -> None:
    producer = producer_knowing({"out": 5})
    tp = TopicPartition("out", 0)
    accumulator = producer._message_accumulator
    big = b"x" * accumulator._batch_size
    records = [("out", b"k", big, 0)] * (internals.QUEUED_BATCHES_PER_PARTITION + 2)
    deliveries: list[tuple[asyncio.Future[Any], int]] = []
    stopped = internals.append_to_open_batches(producer, records, 0, deliveries, lambda _: None)
    # One batch each, up to the limit: the next record goes to send, which waits.
    assert stopped == internals.QUEUED_BATCHES_PER_PARTITION
    assert len(accumulator._batches[tp]) == internals.QUEUED_BATCHES_PER_PARTITION


async def test_appending_to_open_batches_partitions_a_keyed_record_as_send_does() -> None:
    producer = producer_knowing({"out": 5})
    key = b"2024-02-09 21:00:07"
    chosen = producer._partition("out", None, key, None, key, None)
    tp = TopicPartition("out", chosen)
    await producer._message_accumulator.add_message(tp, b"k", b"v", 5)
    deliveries: list[tuple[asyncio.Future[Any], int]] = []
    records: list[tuple[str, bytes | None, bytes | None, int | None]] = [
        ("out", key, b"v", None),
        ("unknown", key, b"v", None),  # no partitions known yet: send waits for them
    ]
    assert internals.append_to_open_batches(producer, records, 0, deliveries, lambda _: None) == 1
    (batch,) = producer._message_accumulator._batches[tp]
    assert deliveries == [(batch.future, 1)]


async def test_a_producer_tracking_its_first_topic_keeps_tracking_those_it_knew() -> None:
    producer = producer_knowing({"keyed": 4, "pairs": 4})
    client = producer.client
    untouched = producer_knowing({"keyed": 4})
    untouched.client.add_topic("changelog")
    # aiokafka alone: from then on its metadata asks for that one topic only.
    assert untouched.client._topics == {"changelog"}
    internals.track_known_topics(producer)
    client.add_topic("changelog")  # a send to a topic the broker was still creating
    assert client._topics == {"keyed", "pairs", "changelog"}
    client.add_topic("later")  # once tracking, as aiokafka does
    assert client._topics == {"keyed", "pairs", "changelog", "later"}


def _record_batch(first_offset: int, count: int) -> MemoryRecords:
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=0, producer_id=-1,
        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20,
    )  # fmt: skip
    for i in range(count):
        builder.append(i, timestamp=1_000 + i, key=b"k%d" % i, value=b"v%d" % i, headers=[])
    buffer = bytearray(builder.build())
    buffer[0:8] = first_offset.to_bytes(8, "big")  # the batch's base offset
    return MemoryRecords(bytes(buffer))


def test_aiokafka_s_fetcher_builds_partition_records_by_the_module_s_name() -> None:
    # What hand_on_decoded_records replaces: a fetcher that built them otherwise would
    # hand on ConsumerRecords, which runs can take, only slower.
    assert "PartitionRecords" in Fetcher._proc_fetch_request.__code__.co_names
    assert Fetcher._proc_fetch_request.__globals__ is vars(fetcher_module)


def test_records_of_topics_in_runs_are_handed_on_as_decoded() -> None:
    aiokafka_own = fetcher_module.PartitionRecords
    consumer = SimpleNamespace(_value_deserializer=None)
    internals.hand_on_decoded_records(cast(Any, consumer), {"events"})
    marked = consumer._value_deserializer
    built = fetcher_module.PartitionRecords

    def fetched(topic: str, deserializer: Any, cls: Any = built) -> list[Any]:
        tp = TopicPartition(topic, 3)
        return list(cls(tp, _record_batch(10, 4), [], 12, None, deserializer, True, 1))

    decoded = fetched("events", marked)
    assert [(r.offset, r.timestamp, r.key, r.value) for r in decoded] == [
        (12, 1_002, b"k2", b"v2"), (13, 1_003, b"k3", b"v3")
    ]  # fmt: skip
    assert not hasattr(decoded[0], "topic")  # the run carries it
    # Another topic of the same consumer, or any topic of another consumer: aiokafka's own.
    assert fetched("other", marked) == fetched("other", None, aiokafka_own)
    assert fetched("events", None) == fetched("events", None, aiokafka_own)
    assert {type(r) for r in fetched("other", marked)} == {ConsumerRecord}
    with pytest.raises(RuntimeError, match="value deserializer"):
        internals.hand_on_decoded_records(cast(Any, consumer), {"events"})


MEMBER = GroupMember(4, "member-4", None)


def test_a_transaction_s_offsets_are_committed_as_a_group_member() -> None:
    request = MemberTxnOffsetCommitRequest("tid", "g", 17, 2, MEMBER, [("events", [(3, 40, "")])])
    struct = request.build(TxnOffsetCommitRequest_v3)
    assert (struct.API_VERSION, struct.transactional_id, struct.group_id) == (3, "tid", "g")
    assert (struct.producer_id, struct.producer_epoch) == (17, 2)
    assert (struct.generation_id, struct.member_id, struct.group_instance_id) == (
        4,
        "member-4",
        None,
    )
    assert struct.topics == [("events", [(3, 40, -1, "", {})], {})]
    assert struct.encode()  # every field fits its schema
    answer = TxnOffsetCommitResponse_v3(0, [("events", [(3, 22, {})], {})], {})
    assert answer.errors == [("events", [(3, 22)])]  # as aiokafka's handler reads version 0


async def test_the_transactional_producer_commits_offsets_as_the_member_it_is_told() -> None:
    producer = producer_knowing({}, transactional_id="tid")
    sender: Any = producer._sender
    aiokafka_own = sender._do_txn_offset_commit
    asked: list[GroupMember] = []

    def member() -> GroupMember:
        asked.append(MEMBER)
        return MEMBER

    internals.commit_offsets_as_member(producer, member, 0.005)
    assert sender._do_txn_offset_commit != aiokafka_own
    # What it replaces: aiokafka's version-0 handler, one request after the look-up.
    source = inspect.getsource(Sender._do_txn_offset_commit)
    assert "TxnOffsetCommitHandler(self, offsets, group_id)" in source
    assert "_find_coordinator(CoordinationType.GROUP, group_id)" in source
    txn_manager = sender._txn_manager
    txn_manager.set_pid_and_epoch(17, 2)
    txn_manager.begin_transaction()
    offsets = {TopicPartition("events", 3): OffsetAndMetadata(40, "")}
    sent = txn_manager.add_offsets_to_txn(offsets, "g")  # what send_offsets_to_transaction awaits
    handler = producer_internals._MemberTxnOffsetCommitHandler(sender, offsets, "g", member, 0.005)
    struct = handler.create_request().build(TxnOffsetCommitRequest_v3)
    assert asked == [MEMBER]  # asked as the request is built
    assert (struct.producer_id, struct.generation_id, struct.member_id) == (17, 4, "member-4")
    assert struct.topics == [("events", [(3, 40, -1, "", {})], {})]
    # Answered while the transaction before is still being completed: asked again soon.
    loading = TxnOffsetCommitResponse_v3(0, [("events", [(3, 14, {})], {})], {})
    assert handler.handle_response(loading) == 0.005
    assert txn_manager.state == TransactionState.IN_TRANSACTION
    # Any other retriable answer waits the producer's retry backoff.
    no_coordinator = TxnOffsetCommitResponse_v3(0, [("events", [(3, 15, {})], {})], {})
    assert handler.handle_response(no_coordinator) == sender._retry_backoff != 0.005
    # The group moved on without the member: the transaction fails for good.
    refused = TxnOffsetCommitResponse_v3(0, [("events", [(3, 22, {})], {})], {})
    assert handler.handle_response(refused) is None
    assert txn_manager.state == TransactionState.FATAL_ERROR
    assert isinstance(sent.exception(), IllegalGenerationError)


async def test_a_transaction_s_first_partitions_are_added_again_after_our_retry_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The broker answers CONCURRENT_TRANSACTIONS to the first AddPartitionsToTxn after a
    commit until that commit's markers are written: aiokafka's handler waits its module's
    override there (and its retry backoff once the transaction has partitions)."""
    monkeypatch.setattr(aiokafka_sender, "BACKOFF_OVERRIDE", aiokafka_sender.BACKOFF_OVERRIDE)
    producer = ExactlyOnceProducer(app.transport)._new_producer("internals-retry")
    assert aiokafka_sender.BACKOFF_OVERRIDE == CONCURRENT_TRANSACTIONS_RETRY_SECONDS
    sender: Any = producer._sender
    txn_manager = sender._txn_manager
    txn_manager.set_pid_and_epoch(17, 2)
    txn_manager.begin_transaction()
    pairs = TopicPartition("pairs", 0)
    txn_manager.maybe_add_partition_to_txn(pairs)
    handler = AddPartitionsToTxnHandler(sender, [pairs])
    concurrent = AddPartitionsToTxnResponse_v0(0, [("pairs", [(0, ConcurrentTransactions.errno)])])
    assert handler.handle_response(concurrent) == CONCURRENT_TRANSACTIONS_RETRY_SECONDS
    added = AddPartitionsToTxnResponse_v0(0, [("pairs", [(0, 0)])])
    assert handler.handle_response(added) is None
    assert txn_manager.txn_partitions == {pairs}
    keyed = TopicPartition("keyed", 1)
    txn_manager.maybe_add_partition_to_txn(keyed)
    later = AddPartitionsToTxnHandler(sender, [keyed])
    concurrent = AddPartitionsToTxnResponse_v0(0, [("keyed", [(1, ConcurrentTransactions.errno)])])
    assert later.handle_response(concurrent) == RETRY_BACKOFF_MS / 1000


def test_the_group_member_is_read_off_aiokafka_s_group_coordinator() -> None:
    coordinator = SimpleNamespace(generation=6, member_id="m-6", _group_instance_id="pod-0")
    consumer = SimpleNamespace(_coordinator=coordinator)
    thread = SimpleNamespace(_ensure_consumer=lambda: consumer)
    assert internals.group_member(SimpleNamespace(_thread=thread)) == GroupMember(6, "m-6", "pod-0")
    signature = inspect.signature(GroupCoordinator.__init__)
    assert "group_instance_id" in signature.parameters
    assert "self.generation = " in inspect.getsource(GroupCoordinator.__init__)
    assert "self.member_id = " in inspect.getsource(GroupCoordinator.__init__)
    assert "self._group_instance_id = group_instance_id" in inspect.getsource(
        GroupCoordinator.__init__
    )


def test_faust_s_commit_table_of_offsets_is_built_only_when_its_log_is_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # faust builds it in `_commit_offsets`, through the module's `terminal`, for mode's
    # `dev` log (written only under DEVLOG).
    source = inspect.getsource(faust.transport.consumer.Consumer._commit_offsets)
    assert "table = terminal.logtable(" in source and 'self.log.dev("' in source
    assert isinstance(app.consumer, ExactlyOnceConsumer)  # which installed the lazy one
    built: list[object] = []
    real = faust.utils.terminal.logtable

    def counted(*args: Any, **kwargs: Any) -> str:
        built.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(faust.utils.terminal, "logtable", counted)
    rows = [("events-0", "17"), ("events-1", "4")]
    table = faust.transport.consumer.terminal.logtable(
        rows, title="Commit Offsets", headers=["TP", "Offset"]
    )
    assert built == []
    assert str(table) == real(rows, title="Commit Offsets", headers=["TP", "Offset"])
    assert "events-1" in str(table) and len(built) == 2


async def test_faust_s_livelock_check_runs_once_in_livelock_check_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    detector = faust.transport.consumer.Consumer.__dict__["_commit_livelock_detector"]
    assert "await self.verify_all_partitions_active()" in inspect.getsource(detector.fun)
    checks: list[object] = []

    async def check(self: Any) -> None:
        checks.append(self)

    monkeypatch.setattr(faust.transport.consumer.Consumer, "verify_all_partitions_active", check)
    consumer = cast(ExactlyOnceConsumer, app.consumer)
    monkeypatch.setattr(consumer, "_livelock_checked_at", time.monotonic())
    await consumer.verify_all_partitions_active()
    assert checks == []
    consumer._livelock_checked_at -= consumer_module.LIVELOCK_CHECK_SECONDS
    await consumer.verify_all_partitions_active()
    await consumer.verify_all_partitions_active()
    assert checks == [consumer]
