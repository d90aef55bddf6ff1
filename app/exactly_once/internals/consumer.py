"""Private members of faust's and aiokafka's consumers, fetcher and group client."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Container, Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, errors
from aiokafka.client import AIOKafkaClient, CoordinationType
from aiokafka.consumer import fetcher as aiokafka_fetcher
from aiokafka.protocol.commit import OffsetFetchRequest
from aiokafka.protocol.group import LeaveGroupRequest
from faust.tables.recovery import Recovery
from faust.transport import consumer as faust_consumer
from faust.types import TP
from faust.utils import terminal

from app.kafka.connection import KafkaConnection
from app.kafka.offset_fetch import StableOffsetFetchRequest, as_version_3
from app.kafka.txn_offset_commit import GroupMember

__all__ = [
    "LastReadOffsets",
    "client_consumer",
    "committed_offset",
    "flow_running",
    "forget_acks_below",
    "forget_unacked",
    "group_generation",
    "group_member",
    "group_member_id",
    "hand_on_decoded_records",
    "install_last_read_offsets",
    "is_changelog",
    "lazy_commit_tables",
    "pending_acks",
    "refreshed_partitions",
    "remove_group_member",
    "restore_offsets",
    "set_fetch_limits",
    "set_fetch_wait",
    "stable_offset_look_ups",
]


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


def pending_acks(consumer: Any) -> bool:
    """Whether faust holds acked offsets not committed yet (`Consumer._acked`, which
    `forget_acks_below` trims as a commit takes them)."""
    return any(consumer._acked.values())


def set_fetch_limits(consumer: AIOKafkaConsumer, min_bytes: int, max_wait_seconds: float) -> None:
    """How much a fetch should gather, and how long the broker may hold it for that;
    read when the consumer starts (faust passes a fixed 1.5 s and aiokafka's 1 byte,
    and has no setting for either)."""
    consumer._fetch_min_bytes = min_bytes
    consumer._fetch_max_wait_ms = int(max_wait_seconds * 1000)


def set_fetch_wait(consumer: AIOKafkaConsumer, max_wait_seconds: float) -> None:
    """How long the broker may hold the next fetch requests of a started consumer: its
    fetcher's `_fetch_max_wait_ms`, which each request it builds reads. Set from the
    worker's loop while the consumer thread builds requests: one int, read whole."""
    fetcher = consumer._fetcher
    if fetcher is not None:  # None until the consumer has started
        fetcher._fetch_max_wait_ms = int(max_wait_seconds * 1000)


def stable_offset_look_ups(consumer: AIOKafkaConsumer) -> None:
    """Make the consumer's look-ups of committed offsets (`AIOKafkaConsumer._client`'s
    `send`, which its group coordinator's look-ups go through, as an `OffsetFetchRequest`
    of its `_consumer_group` and `_partitions`) wait for what aiokafka did not:

    * a transaction's offsets still being committed (docs/faust-gaps.md, 23): sent
      as version 7 with `require_stable` (app/kafka/offset_fetch.py), retried while
      the broker answers UNSTABLE_OFFSET_COMMIT;
    * a coordinator that cannot serve them yet (docs/faust-gaps.md, 22): from
      version 2 on, the broker answers with one error for the whole request and no
      partitions, which aiokafka took for "nothing committed". Raised, the error is
      retried as aiokafka retries the same error given per partition."""
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

    def __init__(self, topics: Container[str]) -> None:
        self.topics = topics  # the registry's own: topics added later count too

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


def hand_on_decoded_records(consumer: AIOKafkaConsumer, topics: Container[str]) -> None:
    """Before the consumer starts (its `_value_deserializer` goes to its fetcher then):
    its records of `topics` reach faust as the record batch decoded them, to be wrapped
    in runs (app/exactly_once/runs.py). aiokafka's fetcher builds `PartitionRecords` by that module
    name: `_PartitionRecords` takes its place, the same for every other consumer."""
    if consumer._value_deserializer is not None:
        raise RuntimeError("the worker's consumer has a value deserializer of its own")
    aiokafka_fetcher.PartitionRecords = _PartitionRecords
    consumer._value_deserializer = _RecordsInRuns(topics)


def is_changelog(consumer: Any, tp: TP) -> bool:
    return bool(consumer._is_changelog_tp(tp))


def restore_offsets(recovery: Recovery, tp: TP) -> tuple[int | None, int | None]:
    """How far a changelog partition's restore has applied records, and its highwater."""
    return recovery.active_offsets.get(tp), recovery.active_highwaters.get(tp)


def group_member_id(consumer: AIOKafkaConsumer) -> str | None:
    """The member id aiokafka's group coordinator holds for this consumer."""
    coordinator = consumer._coordinator
    member_id: str | None = getattr(coordinator, "member_id", None) or None
    return member_id


def group_generation(consumer: Any) -> int:
    """The generation of the group faust's consumer is in (aiokafka's coordinator's
    `generation`, of the thread's `_consumer`); -1 before it started or first joined."""
    client = consumer._thread._consumer
    coordinator = getattr(client, "_coordinator", None)
    generation: int = -1 if coordinator is None else coordinator.generation
    return generation


def group_member(consumer: Any) -> GroupMember:
    """Where faust's consumer (its `_thread`) stands in its group now: the generation,
    member id and group.instance.id aiokafka's group coordinator holds (its
    `generation`, `member_id`, `_group_instance_id`), read from the producer's loop;
    before the first join, generation -1 and no member id, which the broker takes as
    a commit by no member in particular."""
    coordinator = client_consumer(consumer._thread)._coordinator
    return GroupMember(
        coordinator.generation, coordinator.member_id, coordinator._group_instance_id
    )


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


class _LazyTable:
    """A table of a log record's arguments, built only if the record is formatted."""

    __slots__ = ("data", "kwargs")

    def __init__(self, data: Any, kwargs: dict[str, Any]) -> None:
        self.data = data
        self.kwargs = kwargs

    def __str__(self) -> str:
        return terminal.logtable(self.data, **self.kwargs)


class _LazyTerminal:
    """What faust's consumer module calls `terminal`: only its `logtable` is used there,
    once per commit, for a debug log that is off unless DEVLOG is set (mode's `dev`)."""

    @staticmethod
    def logtable(data: Any, **kwargs: Any) -> _LazyTable:
        return _LazyTable(data, kwargs)


def lazy_commit_tables() -> None:
    """faust's `Consumer._commit_offsets` builds a text table of the commit's offsets for
    that log whether it is on or not: 0.8 ms of the 3.7 ms a commit held the event loop
    (py-spy, 36 commits/s). Built now only when the log is written."""
    faust_consumer.terminal = _LazyTerminal  # type: ignore[attr-defined,assignment]
