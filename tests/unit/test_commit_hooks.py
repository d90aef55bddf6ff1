"""What a commit adds to its transaction (ingest's watermark records), and when an
input partition counts as caught up. Against the real consumer class, with faust's
own commit and the broker calls replaced."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from agents import ingest
from app.exactly_once import backlog, internals, step
from app.exactly_once import commit as commit_steps
from app.exactly_once.outbox import partition_transactional_id
from app.exactly_once.partition_tasks import PartitionTask, PartitionTasks
from app.faust_app import app
from pairing.records import WATERMARK_KEY, decode_watermark, loads
from pairing.watermarks import SourceProgress
from tests.unit.conftest import Transactions

pytestmark = pytest.mark.usefixtures("own_tasks")


ASSIGNED, REVOKED, OTHER = TP("hooked", 0), TP("hooked", 1), TP("plain", 0)


async def test_records_before_commit_go_only_with_partitions_still_assigned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[tuple[TP, list[Any]]] = []
    committed: list[dict[TP, int]] = []

    async def send(_: Any, tp: TP, records: list[Any]) -> None:
        sent.append((tp, records))

    async def commit(_: Any, offsets: dict[TP, int], start_new_transaction: bool = True) -> bool:
        committed.append(dict(offsets))
        return True

    monkeypatch.setattr(commit_steps, "send_in_transaction", send)
    monkeypatch.setattr(faust_aiokafka.Consumer, "_commit_offsets", commit)
    monkeypatch.setattr(app.consumer, "assignment", lambda: {ASSIGNED, OTHER})
    tasks = app.partition_tasks
    # REVOKED's task is still there: faust commits before the revocation drops it.
    tasks.assigned({ASSIGNED, REVOKED, OTHER})
    monkeypatch.setitem(
        tasks.commit_hooks,
        "hooked",
        lambda task: [("keyed", b"k", b"%d" % task.tp.partition, 0)],
    )
    offsets = {ASSIGNED: 5, REVOKED: 7, OTHER: 9}
    assert await app.consumer._commit_offsets(offsets)
    assert sent == [(ASSIGNED, [("keyed", b"k", b"0", 0)])]
    assert committed == [offsets]  # faust still decides what to do with the revoked one


async def test_caught_up_means_fetched_processed_and_committed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tp = TP("events", 3)
    position = 10

    async def at(_: TP) -> int:
        return position

    monkeypatch.setattr(app.consumer, "highwater", lambda _: 10)
    monkeypatch.setattr(app.consumer, "position", at)
    assert not await backlog.caught_up(app, tp)  # not assigned here
    app.partition_tasks.assigned({tp})
    task = app.partition_tasks.get(tp)
    assert isinstance(task, PartitionTask)
    progress = task.offsets
    assert not await backlog.caught_up(app, tp)  # not yet sought to the committed offset
    progress.sought_to_committed(8)
    app.consumer._committed_offset[tp] = 8
    progress.processed(8)
    progress.processed(9)
    assert not await backlog.caught_up(app, tp)  # processed, not committed
    app.consumer._committed_offset[tp] = 10
    assert await backlog.caught_up(app, tp)
    async with task.lock:  # a step under way: its records are in no transaction yet
        assert not await backlog.caught_up(app, tp)
    position = 9  # more to fetch
    assert not await backlog.caught_up(app, tp)


def test_records_waiting_are_those_the_last_fetches_found_beyond_processing(
    own_tasks: PartitionTasks,
) -> None:
    """What a commit reads to tell whether the worker is behind (commit.let_steps_go_now)."""
    behind, revoked, unsought, ahead = (TP("events", p) for p in range(4))
    restored = TP("table-changelog", 0)  # sought to 0 like the others; a restore read it all
    own_tasks.assigned({behind, revoked, unsought, ahead, restored})
    for tp, reached in ((behind, 10), (revoked, 7), (ahead, 30), (restored, 0)):
        task = own_tasks.get(tp)
        assert task is not None
        task.offsets.sought_to_committed(reached)

    class Consumer:
        def highwater(self, tp: TP) -> int | None:
            if tp == revoked:  # aiokafka's, once its thread has the partition no more
                raise AssertionError("Partition is not assigned")
            return {behind: 25, unsought: 40, ahead: 20, restored: 90_000}[tp]

        def _is_changelog_tp(self, tp: TP) -> bool:
            return tp.topic.endswith("-changelog")

    assert backlog.records_waiting(Consumer(), own_tasks) == 15
    assert backlog.fetched_end(Consumer(), revoked) is None
    assert backlog.fetched_end(app.consumer, behind) is None  # its thread not started


async def test_before_a_partition_is_declared_idle_its_end_is_asked_of_the_broker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A worker back from a stall: its last fetch ended at 10, and all of that is
    # processed and committed; the broker has had more since.
    tp = TP("events", 1)
    broker_end: dict[TP, int] | Exception = {tp: 25}

    async def at(_: TP) -> int:
        return 10

    async def ends(_: Any, tps: list[TP]) -> dict[TP, int]:
        assert tps == [tp]
        if isinstance(broker_end, Exception):
            raise broker_end
        return broker_end

    monkeypatch.setattr(app.consumer, "highwater", lambda _: 10)
    monkeypatch.setattr(app.consumer, "position", at)
    monkeypatch.setattr(backlog, "end_offsets", ends)
    app.partition_tasks.assigned({tp})
    task = app.partition_tasks.get(tp)
    assert isinstance(task, PartitionTask)
    task.offsets.sought_to_committed(9)
    task.offsets.processed(9)
    app.consumer._committed_offset[tp] = 10
    assert await backlog.caught_up(app, tp)  # by the last fetch
    assert not await backlog.caught_up(app, tp, ask_broker=True)  # 15 records landed since
    broker_end = {tp: 10}
    assert await backlog.caught_up(app, tp, ask_broker=True)
    broker_end = KafkaConnectionError("the broker is away")
    assert not await backlog.caught_up(app, tp, ask_broker=True)


async def test_a_revocation_retires_the_transaction_producers_of_revoked_partitions(
    transactions: Transactions, monkeypatch: pytest.MonkeyPatch
) -> None:
    # faust would keep a producer whose partition becomes a standby, and reuse it,
    # fenced, when the partition comes back (docs/exactly-once.md).
    tp = TP("events", 2)
    revoked, kept = partition_transactional_id(app, tp), "it-kept-0"
    retired = await transactions.begin(revoked)
    other = await transactions.begin(kept)
    await app.consumer._retire_transaction_producers({tp})
    assert retired.stopped and internals.transaction_producer(revoked) is None
    assert not other.stopped and internals.transaction_producer(kept) is not None


async def test_tables_count_as_restored_only_after_faust_says_so(own_tasks: PartitionTasks) -> None:
    tp = TP("t", 0)
    own_tasks.assigned({tp})
    assert not own_tasks.restored.is_set()
    await app.on_rebalance_complete.send()
    assert own_tasks.restored.is_set()
    own_tasks.revoked({tp})
    assert not own_tasks.restored.is_set()
    own_tasks.assigned({tp})
    assert not own_tasks.restored.is_set()


async def test_waiting_before_a_step_ends_when_the_flow_stops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Consumer:
        suspend_flow = asyncio.Event()

    monkeypatch.setattr(app, "_consumer", Consumer())
    never = asyncio.Event()
    waiting = asyncio.ensure_future(step.before_step(app, never.wait()))
    await asyncio.sleep(0)
    assert not waiting.done()
    Consumer.suspend_flow.set()  # a rebalance or a stop begins
    async with asyncio.timeout(5):
        await waiting


async def test_idle_input_partitions_given_up_hold_the_watermark_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[tuple[str, bytes, bytes, int]] = []

    async def send(topic: str, key: bytes, value: bytes, partition: int, *_: Any) -> Any:
        sent.append((topic, key, value, partition))
        delivered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        delivered.set_result(None)
        return delivered

    monkeypatch.setattr(app.producer, "send", send)
    events = ingest.conf.events_topic
    idle, busy, unloaded = TP(events, 0), TP(events, 1), TP(events, 2)
    tasks = app.partition_tasks
    tasks.assigned({idle, busy, unloaded})
    for tp, went_idle in [(idle, True), (busy, False)]:
        task = tasks.get(tp)
        assert task is not None
        source = task.processor(SourceProgress, lambda _: SourceProgress(40, 0.0))
        if went_idle:
            source.went_idle()
    await ingest.EVENT_TIME.on_revoke({idle, busy, unloaded})
    assert [p for _, _, _, p in sent] == list(range(ingest.conf.partitions))
    for topic, key, value, _ in sent:
        update = decode_watermark(loads(value))
        assert (topic, key) == (ingest.keyed_events.get_topic_name(), WATERMARK_KEY)
        assert (update.source, update.progress_us, update.idle) == (0, 40, False)
    sent.clear()
    await ingest.EVENT_TIME.on_revoke({idle})  # told once
    assert sent == []
