"""Private members of faust's and aiokafka's producers and record accumulator."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer, errors
from aiokafka.client import CoordinationType
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.producer import sender as aiokafka_sender
from aiokafka.structs import TopicPartition
from faust.transport.drivers import aiokafka as faust_aiokafka

from app.kafka.partitioner import default_partition
from app.kafka.txn_offset_commit import (
    NOT_A_CURRENT_MEMBER,
    GroupMember,
    MemberTxnOffsetCommitRequest,
)

__all__ = [
    "QUEUED_BATCHES_PER_PARTITION",
    "add_to_transaction",
    "append_to_open_batches",
    "commit_offsets_as_member",
    "deliver_gathered_batches",
    "keyed_partitioner",
    "metadata_task",
    "plain_producer",
    "retry_concurrent_transactions_after",
    "sender_task",
    "track_known_topics",
    "transaction_partitions",
    "transaction_producer",
]


def transaction_producer(transactional_id: str) -> tuple[Any, asyncio.Lock] | None:
    """The aiokafka producer faust keeps for a transactional id, and the lock faust
    takes around its sends and commits; None when no such transaction is open."""
    producer = faust_aiokafka.Producer._transaction_producers.get(transactional_id)
    if producer is None:
        return None
    return producer, faust_aiokafka.Producer._trn_locks[transactional_id]


class _MemberTxnOffsetCommitHandler(aiokafka_sender.TxnOffsetCommitHandler):  # type: ignore[misc]
    """aiokafka's handler of a transaction's offset commit (`TxnOffsetCommitHandler`:
    its `_sender`, that one's `_txn_manager`, and `_offsets`, `_group_id`), sending
    version 3 with the committing group member (app/kafka/txn_offset_commit.py). An
    answer that the member is not current fails the transaction for good, as a fenced
    producer's does: aiokafka's handler raised it inside the sender."""

    def __init__(
        self,
        sender: Any,
        offsets: Any,
        group_id: str,
        member: Callable[[], GroupMember],
        loading_retry_seconds: float,
    ) -> None:
        super().__init__(sender, offsets, group_id)
        self._member = member
        self._loading_retry = loading_retry_seconds

    def create_request(self) -> MemberTxnOffsetCommitRequest:
        txn_manager = self._sender._txn_manager
        topics: defaultdict[str, list[tuple[int, int, str | None]]] = defaultdict(list)
        for tp, offset in sorted(self._offsets.items()):
            topics[tp.topic].append((tp.partition, offset.offset, offset.metadata))
        return MemberTxnOffsetCommitRequest(
            txn_manager.transactional_id,
            self._group_id,
            txn_manager.producer_id,
            txn_manager.producer_epoch,
            self._member(),
            list(topics.items()),
        )

    def handle_response(self, resp: Any) -> float | None:
        for topic, partitions in resp.errors:
            for partition, code in partitions:
                error = errors.for_code(code)
                if error in NOT_A_CURRENT_MEMBER:
                    self._sender._txn_manager.fatal_error(error(f"{topic}[{partition}]"))
                    return None
        backoff: float | None = super().handle_response(resp)
        codes = {code for _, partitions in resp.errors for _, code in partitions}
        if backoff is not None and codes == {errors.CoordinatorLoadInProgressError.errno}:
            return self._loading_retry
        return backoff


def commit_offsets_as_member(
    producer: AIOKafkaProducer, member: Callable[[], GroupMember], loading_retry_seconds: float
) -> None:
    """Make the transactional producer commit its transactions' offsets as `member()`
    (asked as each request is built), so that the group coordinator refuses them once
    the member has left the group's current generation. In place of its sender's
    `_do_txn_offset_commit`, which does the same with version 0 (no member): after the
    group coordinator's look-up (the sender's `_find_coordinator`), one request, and the
    sender asks again while offsets are left. An answer of COORDINATOR_LOAD_IN_PROGRESS
    alone is asked again after `loading_retry_seconds`, not the retry backoff: a commit
    right after the one before meets it while that one's markers are written (a few ms)."""
    sender = producer._sender

    async def txn_offset_commit(offsets: Any, group_id: str) -> None:
        if not offsets:
            return
        try:
            node_id = await sender._find_coordinator(CoordinationType.GROUP, group_id)
        except errors.GroupAuthorizationFailedError as exc:
            sender._txn_manager.error_transaction(exc)
            return
        handler = _MemberTxnOffsetCommitHandler(
            sender, offsets, group_id, member, loading_retry_seconds
        )
        await handler.do(node_id)

    sender._do_txn_offset_commit = txn_offset_commit


def retry_concurrent_transactions_after(seconds: float) -> None:
    """Retry a transaction's first AddPartitionsToTxn after `seconds` when the broker
    answers CONCURRENT_TRANSACTIONS: it does until it has written the markers of the
    transaction before (a few ms on a local broker). aiokafka's sender waits its module's
    `BACKOFF_OVERRIDE` (20 ms) there, in every producer of the process; with commits
    back to back, that wait was most of the time between two of them."""
    aiokafka_sender.BACKOFF_OVERRIDE = seconds


async def deliver_gathered_batches(producer: AIOKafkaProducer) -> None:
    """Close the batches the producer is still gathering and wait until every batch it
    holds is delivered: its accumulator's `flush_for_commit`, which aiokafka's sender
    awaits before the end of a transaction, after the offsets. A produce request that
    starts while the transaction's offsets go in (AddOffsetsToTxn, TxnOffsetCommit)
    waits at the broker: its first write of a partition in the transaction is verified
    with the transaction coordinator, which answers CONCURRENT_TRANSACTIONS while it
    writes the offsets' state, and the broker asks again after
    add.partitions.to.txn.retry.backoff.ms (20 ms). `producer.flush` would wait out
    the linger instead."""
    await producer._message_accumulator.flush_for_commit()


def transaction_partitions(producer: AIOKafkaProducer) -> frozenset[TopicPartition]:
    """The partitions the producer's open transaction writes: those its transaction
    manager (`_txn_manager`) has added and those still to be added."""
    txn_manager = producer._txn_manager
    return frozenset(txn_manager.txn_partitions | txn_manager.partitions_to_add())


def add_to_transaction(producer: AIOKafkaProducer, tps: frozenset[TopicPartition]) -> None:
    """Add `tps` to the producer's open transaction before records for them come: its
    sender adds what is pending in one AddPartitionsToTxn (`maybe_add_partition_to_txn`).
    Added one by one as records come, a partition's first records could go while the
    coordinator still wrote the next one's: their write waited for the broker's retry
    (`deliver_gathered_batches`)."""
    txn_manager = producer._txn_manager
    for tp in tps:
        txn_manager.maybe_add_partition_to_txn(tp)


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
