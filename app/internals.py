"""Every private member of faust-streaming and aiokafka that pairstream relies on,
named here. Reads of private attributes happen only in these functions; methods our
subclasses override are listed in `OVERRIDDEN`. tests/unit/test_internals.py checks
each against the installed (pinned) versions, so an upgrade that removes or changes
one fails there, in seconds, rather than in the fault matrix.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import faust
import rocksdict
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, errors
from aiokafka.client import AIOKafkaClient, CoordinationType
from aiokafka.consumer import fetcher as aiokafka_fetcher
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.protocol.commit import OffsetFetchRequest
from aiokafka.protocol.group import LeaveGroupRequest
from aiokafka.structs import TopicPartition
from faust.assignor import PartitionAssignor
from faust.tables import TableManager
from faust.tables.recovery import Recovery
from faust.transport.consumer import TransactionManager
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from app.kafka_connection import KafkaConnection
from app.kafka_partitioner import default_partition
from app.offset_fetch import StableOffsetFetchRequest, as_version_3

# Methods of faust's classes that app/consumer.py, app/faust_app.py and app/worker.py
# override, with the parameters the overrides take (checked against the base classes'
# signatures).
OVERRIDDEN: dict[type, dict[str, tuple[str, ...]]] = {
    faust_aiokafka.Consumer: {
        "_new_consumer_thread": ("self",),
        "_commit_handler": ("self",),
        "_commit_tps": ("self", "tps", "start_new_transaction"),
        "_commit_offsets": ("self", "offsets", "start_new_transaction"),
        "_new_offset": ("self", "tp"),
        "_add_gap": ("self", "tp", "offset_from", "offset_to"),
        "_getmany": ("self", "active_partitions", "timeout"),
        "commit_and_end_transactions": ("self",),
        "on_partitions_revoked": ("self", "revoked"),
        "on_partitions_assigned": ("self", "assigned", "generation_id"),
        "position": ("self", "tp"),
        "perform_seek": ("self",),
        "resume_partitions": ("self", "tps"),
        "resume_flow": ("self",),
        "wait_first": ("self", "coros", "timeout"),
    },
    faust_aiokafka.AIOKafkaConsumerThread: {
        "_highwaters": ("self", "partitions"),
        "_create_worker_consumer": ("self", "transport"),
        "on_start": ("self",),
        "on_partitions_assigned": ("self", "assigned", "generation_id"),
    },
    TransactionManager: {
        "_start_transactions": ("self", "tids"),
        "commit": ("self", "offsets", "start_new_transaction"),
    },
    faust_aiokafka.Producer: {
        "_new_producer": ("self", "transactional_id"),
        "_settings_extra": ("self",),
        "commit_transactions": ("self", "tid_to_offset_map", "group_id", "start_new_transaction"),
    },
    faust.App: {
        "_new_transport": ("self",),
        "_new_producer_transport": ("self",),
        "on_init_dependencies": ("self",),
        "FlowControlQueue": ("self", "maxsize", "clear_on_resume"),
    },
    faust.Worker: {
        "on_setup_root_logger": ("self", "logger", "level"),
        "on_first_start": ("self",),
        "on_startup_finished": ("self",),
        "stop": ("self",),
    },
    TableManager: {"on_start": ("self",)},
    PartitionAssignor: {"assign": ("self", "cluster", "member_metadata")},
}


def committed_offset(consumer: Any, tp: TP) -> int | None:
    """The offset faust last committed for tp in this assignment."""
    offset: int | None = consumer._committed_offset.get(tp)
    return offset


def forget_acks_below(consumer: Any, tp: TP, offset: int) -> None:
    """Drop faust's record of acked offsets (`Consumer._acked`, `_acked_index`) below
    `offset`, the offset about to be committed. faust's own commit offset clears them;
    ours does not use them."""
    acked = consumer._acked.get(tp)
    if acked:
        acked[:] = [o for o in acked if o >= offset]
        consumer._acked_index[tp] = set(acked)


def forget_unacked(consumer: Any, message: Any) -> None:
    """Take a skipped message out of faust's in-flight set (`wait_empty` waits for it)
    without acking its offset, which a commit would then pass."""
    message.acked = True
    consumer._unacked_messages.discard(message)


def flow_running(consumer: Any) -> bool:
    """The consumer's flow is not suspended (as during a rebalance) and the consumer is
    neither stopping nor crashed (mode's `Service._stopped`, `_crashed`): what faust's
    `wait_first` races each record's hand-over against."""
    return not (
        consumer.suspend_flow.is_set() or consumer._stopped.is_set() or consumer._crashed.is_set()
    )


def _unread() -> int | None:
    return None


class LastReadOffsets(defaultdict[TP, int | None]):
    """faust's last-read offset per partition (`Consumer._read_offset`), which a
    seek back can hold down until the fetcher hands on a record at the sought offset.

    faust's fetcher drops every fetched record below a partition's last-read offset,
    and sets that offset after handing each record on. That hand-over runs as a task,
    so an agent can receive a record fetched before a seek back, skip it and seek,
    and only then see the fetcher set the record's offset, over the sought one. All
    the seek fetches again is then dropped but that record, which is skipped and
    sought back from again, over and over: a partition of the fault matrix stalled
    for ten minutes so. Under a hold, the offset stays at the sought one until a
    record at it (or after it, the sought offset being a transaction marker) passes.
    """

    def __init__(self) -> None:
        super().__init__(_unread)
        self.holds: dict[TP, int] = {}

    def hold(self, tp: TP, offset: int) -> None:
        self.holds[tp] = offset
        super().__setitem__(tp, offset)

    def release(self, tps: Iterable[TP]) -> None:
        for tp in tps:
            self.holds.pop(tp, None)

    def __setitem__(self, tp: TP, offset: int | None) -> None:
        if self.holds:  # rare: only between a seek back and the record it asks for
            held = self.holds.get(tp)
            if held is not None and offset is not None:
                if offset > held + 1:
                    return
                del self.holds[tp]
        super().__setitem__(tp, offset)


def install_last_read_offsets(consumer: Any) -> LastReadOffsets:
    """Replace faust's last-read offsets (a defaultdict its fetcher binds when it
    starts) with `LastReadOffsets`; called before the consumer starts."""
    offsets = LastReadOffsets()
    offsets.update(consumer._read_offset)
    consumer._read_offset = offsets
    return offsets


def client_consumer(thread: Any) -> AIOKafkaConsumer:
    """aiokafka's consumer under faust's consumer thread."""
    consumer: AIOKafkaConsumer = thread._ensure_consumer()
    return consumer


async def refreshed_partitions(consumer: Any, topic: str) -> int | None:
    """How many partitions `topic` has, after the group consumer has asked the broker
    for the cluster's metadata, on the consumer thread's loop (faust's
    `Consumer._thread`, aiokafka's `_client`); None when unknown. On the group leader,
    a subscribed topic whose partition count changed makes the group join again.
    (faust's `Consumer.topic_partitions` reads aiokafka's coordinator's snapshot,
    which only the leader keeps up to date.)"""
    thread = consumer._thread

    async def refresh() -> int | None:
        client = client_consumer(thread)
        await client._client.force_metadata_update()
        partitions = client.partitions_for_topic(topic)
        return len(partitions) if partitions else None

    found: int | None = await thread.call_thread(refresh)
    return found


def set_fetch_limits(consumer: AIOKafkaConsumer, min_bytes: int, max_wait_seconds: float) -> None:
    """How much a fetch should gather, and how long the broker may hold it for that;
    read when the consumer starts (faust passes a fixed 1.5 s and aiokafka's 1 byte,
    and has no setting for either)."""
    consumer._fetch_min_bytes = min_bytes
    consumer._fetch_max_wait_ms = int(max_wait_seconds * 1000)


def stable_offset_look_ups(consumer: AIOKafkaConsumer) -> None:
    """Make the consumer's look-ups of committed offsets (`AIOKafkaConsumer._client`'s
    `send`, which its group coordinator's look-ups go through, as an `OffsetFetchRequest`
    of its `_consumer_group` and `_partitions`) wait for what aiokafka did not:

    * a transaction's offsets still being committed (point 23): sent as version 7 with
      `require_stable` (app/offset_fetch.py), retried while the broker answers
      UNSTABLE_OFFSET_COMMIT;
    * a coordinator that cannot serve them yet (point 22): from version 2 on, the broker
      answers with one error for the whole request and no partitions, which aiokafka
      took for "nothing committed" (faust then sought the partitions to their start,
      and after a broker bounce ingest processed most of its input again). Raised, the
      error is retried as aiokafka retries the same error given per partition."""
    client = consumer._client
    send = client.send

    async def send_stable(node_id: int, request: Any, **kwargs: Any) -> Any:
        if not isinstance(request, OffsetFetchRequest) or request._partitions is None:
            return await send(node_id, request, **kwargs)
        stable = StableOffsetFetchRequest(request._consumer_group, request._partitions)
        return as_version_3(await send(node_id, stable, **kwargs))

    client.send = send_stable


class _RecordsInRuns:
    """The value deserializer of the worker's aiokafka consumer, which aiokafka hands to
    each `PartitionRecords` it builds: it names the topics whose records are handed on
    in runs (`hand_on_decoded_records`). Never called: `_PartitionRecords` takes it out."""

    __slots__ = ("topics",)

    def __init__(self, topics: set[str]) -> None:
        self.topics = topics  # the registry's own set: topics added later count too

    def __call__(self, value: bytes | None) -> bytes | None:
        return value


def _as_decoded(tp: Any, record: Any) -> Any:
    return record


class _PartitionRecords(aiokafka_fetcher.PartitionRecords):  # type: ignore[misc]
    """aiokafka's, which for a topic handed on in runs yields each record as the record
    batch decoded it (offset, timestamp, key, value, headers; no topic or partition, the
    run has those) instead of building a `ConsumerRecord` of it: 0.19 against 0.58 µs a
    record, timeit. Records of other topics, and of consumers not so marked, are
    aiokafka's own. Which batches and records it yields (aborted transactions, control
    batches, offsets below the fetch) is aiokafka's `_unpack_records`, unchanged."""

    def __init__(
        self,
        tp: Any,
        records: Any,
        aborted_transactions: Any,
        fetch_offset: int,
        key_deserializer: Any,
        value_deserializer: Any,
        check_crcs: bool,
        isolation_level: int,
    ) -> None:
        runs = value_deserializer if isinstance(value_deserializer, _RecordsInRuns) else None
        super().__init__(
            tp,
            records,
            aborted_transactions,
            fetch_offset,
            key_deserializer,
            None if runs is not None else value_deserializer,
            check_crcs,
            isolation_level,
        )
        if runs is not None and tp.topic in runs.topics:
            self._consumer_record = _as_decoded


def hand_on_decoded_records(consumer: AIOKafkaConsumer, topics: set[str]) -> None:
    """Before the consumer starts (its `_value_deserializer` goes to its fetcher then):
    its records of `topics` reach faust as the record batch decoded them, to be wrapped
    in runs (app/runs.py). aiokafka's fetcher builds `PartitionRecords` by that module
    name: `_PartitionRecords` takes its place, the same for every other consumer."""
    if consumer._value_deserializer is not None:
        raise RuntimeError("the worker's consumer has a value deserializer of its own")
    aiokafka_fetcher.PartitionRecords = _PartitionRecords
    consumer._value_deserializer = _RecordsInRuns(topics)


async def take_tables_on(manager: TableManager) -> None:
    """What faust's table manager does first when it starts (`_update_channels`): the
    tables' changelogs added to the subscription, each table started, the changelog
    partitions paused until recovery."""
    await manager._update_channels()


def is_changelog(consumer: Any, tp: TP) -> bool:
    return bool(consumer._is_changelog_tp(tp))


def transaction_producer(transactional_id: str) -> tuple[Any, asyncio.Lock] | None:
    """The aiokafka producer faust keeps for a transactional id, and the lock faust
    takes around its sends and commits; None when no such transaction is open."""
    producer = faust_aiokafka.Producer._transaction_producers.get(transactional_id)
    if producer is None:
        return None
    return producer, faust_aiokafka.Producer._trn_locks[transactional_id]


def track_known_topics(producer: AIOKafkaProducer) -> None:
    """Keep the topics an aiokafka producer knows in its metadata once it tracks one.

    Its client (`AIOKafkaClient`) asks the broker for every topic while it tracks none
    (`_topics` empty), and for the tracked ones only after its first `add_topic`, which
    a send to a topic missing from its metadata makes. The topics it had sent to until
    then, untracked, drop out of its metadata: their batches wait for a leader for
    ever, the sender asks for metadata in a loop, and a commit, which flushes them,
    hangs until the transaction times out. Seen when a worker's first sends went to a
    changelog the broker was still creating (the smoke run's parts side by side, on
    a fresh broker: about 1,000 metadata requests a second for 60 s)."""
    client = producer.client
    add_topic = client.add_topic

    def add_topic_keeping_known(topic: str) -> asyncio.Future[Any]:
        if not client._topics:
            client._topics.update(client.cluster.topics())
        future: asyncio.Future[Any] = add_topic(topic)
        return future

    client.add_topic = add_topic_keeping_known


def sender_task(producer: Any) -> asyncio.Task[Any] | None:
    """The task of an aiokafka producer's sender routine (`AIOKafkaProducer._sender`'s
    `sender_task`), which sends its batches and transaction requests; None before the
    producer has started."""
    task: asyncio.Task[Any] | None = producer._sender.sender_task
    return task


def metadata_task(producer: Any) -> asyncio.Task[Any] | None:
    """The task of an aiokafka producer's metadata synchronizer (its client's
    `_sync_task`), which runs every metadata update its sends and produce retries wait
    for; None before the producer has started and after it has closed. aiokafka does
    not restart it if it ends."""
    task: asyncio.Task[Any] | None = producer.client._sync_task
    return task


QUEUED_BATCHES_PER_PARTITION = 8
"""How many batches `append_to_open_batches` lets wait for the sender in one
partition before it hands a record to `send`, which waits for the first of them to be
drained: about 2 MiB at the default batch size, so a broker that falls behind still
slows the steps down."""


def append_to_open_batches(
    producer: Any,
    records: Sequence[tuple[str, bytes | None, bytes | None, int | None]],
    start: int,
    deliveries: list[tuple[asyncio.Future[Any], int]],
    watch: Callable[[asyncio.Future[Any]], None],
) -> int:
    """Append `records[start:]`, in order, to the aiokafka producer's batches (the
    accumulator's `_batches`; of each batch its `BatchBuilder` and that one's record
    builder and `_relative_offset`) without an await: what `AIOKafkaProducer.send` ends
    in when a batch has room, less its per-record metadata look-ups, checks, coroutine,
    future and `RecordMetadata`, and less `BatchBuilder.append`'s own per-record work
    (a record here costs a third of what it did through that, timeit). A record with no
    partition gets the one `send` would choose (`keyed_partitioner`).

    Where a partition has no batch with room, one is opened as `send` opens one
    (`_append_batch`, which also adds the partition to the transaction), behind the
    full ones still waiting for the sender. `send` would wait instead for the full
    batch to be drained into a request, which waits for the producer's request in
    flight: a step of one partition stopped the agent, and every partition it serves,
    for up to 120 ms (a timed development run: 0.9 s of 5 s in such waits).

    For each record appended, its delivery goes to `deliveries`: the batch's own future
    (the batch's records are delivered or fail together; its offset is the batch's
    first) and the record's offset from that first one; `watch` is called with each
    batch future once or more. Stops at the first record whose partition is not known
    yet or has QUEUED_BATCHES_PER_PARTITION batches waiting, or when the accumulator is
    closed or has failed, and returns its index (`len(records)` once all are appended):
    that one is sent the usual way."""
    accumulator = producer._message_accumulator
    if accumulator._closed or accumulator._exception is not None:
        return start
    batches = accumulator._batches
    partitioners: dict[str, Callable[[bytes], int] | None] = {}
    # (topic, partition) -> its open batch's builder, that one's record append, future.
    # Nothing here awaits, so no batch is drained meanwhile.
    open_batches: dict[tuple[str, int], tuple[Any, Any, asyncio.Future[Any]]] = {}
    no_headers: list[tuple[str, bytes]] = []  # the record builder takes a list, and only reads it
    for index in range(start, len(records)):
        topic, key, value, partition = records[index]
        if partition is None:
            if topic not in partitioners:
                partitioners[topic] = keyed_partitioner(producer, topic)
            choose = partitioners[topic]
            if key is None or choose is None:
                return index
            partition = choose(key)
        # Keyed by TopicPartition, a named tuple: a plain tuple finds it.
        place = (topic, partition)
        while True:  # a second turn only after closing a full batch; bounded by the limit
            found = open_batches.get(place)
            if found is None:
                queue = batches.get(place)
                if queue and not queue[-1]._builder._closed:
                    batch = queue[-1]
                else:
                    batch = _open_batch(producer, topic, partition)
                    if batch is None:
                        return index
                found = open_batches[place] = _appending(batch, watch)
            builder, append, future = found
            offset = builder._relative_offset
            if append(offset, None, key, value, no_headers) is not None:
                break
            builder.close()  # full, as BatchBuilder.append closes it
            del open_batches[place]
        builder._relative_offset = offset + 1
        deliveries.append((future, offset))
    return len(records)


def _appending(
    batch: Any, watch: Callable[[asyncio.Future[Any]], None]
) -> tuple[Any, Any, asyncio.Future[Any]]:
    builder = batch._builder
    watch(batch.future)
    return builder, builder._builder.append, batch.future


def _open_batch(producer: Any, topic: str, partition: int) -> Any:
    """A new batch behind the partition's others, as `send` opens one; None if the
    producer does not know the partition yet or has enough batches waiting in it."""
    accumulator = producer._message_accumulator
    queue = accumulator._batches.get((topic, partition))
    if queue is not None and len(queue) >= QUEUED_BATCHES_PER_PARTITION:
        return None
    if partition not in (producer.client.cluster.partitions_for_topic(topic) or ()):
        return None
    return accumulator._append_batch(accumulator.create_builder(), TopicPartition(topic, partition))


def keyed_partitioner(producer: Any, topic: str) -> Callable[[bytes], int] | None:
    """The partition the aiokafka producer's `send` gives a keyed record of `topic`
    (its `_partitioner`, over the partitions its metadata knows then); None when it
    knows none yet."""
    cluster = producer.client.cluster
    partitions = cluster.partitions_for_topic(topic)
    if not partitions:
        return None
    every = list(partitions)
    available = list(cluster.available_partitions_for_topic(topic))
    choose = producer._partitioner
    if type(choose) is DefaultPartitioner:
        # Its choice, the same hash computed in a third of the time.
        return lambda key: default_partition(key, every)

    def partition(key: bytes) -> int:
        chosen: int = choose(key, every, available)
        return chosen

    return partition


def plain_producer(producer: Any) -> Any:
    """The aiokafka producer under faust's producer that sends outside any transaction
    (`Producer._ensure_producer`)."""
    return producer._ensure_producer()


def local_partition(table: Any, partition: int) -> Any:
    """The rocksdict database of one partition of a table's local store, opened on
    first use (faust routes its own reads and writes by the current event)."""
    return table.data._db_for_partition(partition)


def local_write_batch() -> Any:
    """A write batch for `local_partition`'s databases, which faust opens in raw mode."""
    return rocksdict.WriteBatch(raw_mode=True)


def restore_offsets(recovery: Recovery, tp: TP) -> tuple[int | None, int | None]:
    """How far a changelog partition's restore has applied records, and its highwater."""
    return recovery.active_offsets.get(tp), recovery.active_highwaters.get(tp)


def group_member_id(consumer: AIOKafkaConsumer) -> str | None:
    """The member id aiokafka's group coordinator holds for this consumer."""
    coordinator = consumer._coordinator
    member_id: str | None = getattr(coordinator, "member_id", None) or None
    return member_id


async def remove_group_member(kafka: KafkaConnection, group: str, member_id: str) -> None:
    """Ask the group's coordinator to remove a member, as if it had left (LeaveGroup on
    its behalf; aiokafka's client has no public call for it). Raises the broker's error."""
    client = AIOKafkaClient(**kafka.aiokafka())
    await client.bootstrap()
    try:
        node_id = await client.coordinator_lookup(CoordinationType.GROUP, group)
        response = await client.send(node_id, LeaveGroupRequest(group, member_id))
        error = errors.for_code(response.error_code)
        if error is not errors.NoError:
            raise error()
    finally:
        await client.close()
