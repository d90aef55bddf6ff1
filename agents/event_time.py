"""Event time told downstream: a stage that re-keys input partitions (its *sources*)
into keyed partitions stamps each event with its source's progress and tells every
keyed partition how far each source has got (docs/event-time.md). Ingest does so for
pairing, the pattern router for the patterns: `EventTimeTeller` is what they share.

What a keyed partition is told, and when:
- with the source's first event after an assignment or after idleness, in its
  transaction, ahead of the event (`announce_due`, `tell`);
- with a commit that moved the source's progress, at most once per watermark interval
  (`before_commit`);
- caught up: the progress left untold, and after the idle timeout that the source is
  idle, outside any transaction (`tell_caught_up`);
- on revocation: an idle source handed over holds the watermark again (`on_revoke`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Container, Sequence
from typing import Any, Protocol

from faust.types import TP

from app.exactly_once.application import PairstreamApp
from app.exactly_once.backlog import caught_up
from app.exactly_once.outbox import Record
from app.exactly_once.partition_tasks import PartitionTask
from app.settings import settings
from pairing.records import HANDED_WATERMARK_KEY, WATERMARK_KEY, Source, encode_watermark
from pairing.watermarks import SourceProgress, WatermarkUpdate
from tables import TableWriter

log = logging.getLogger(__name__)


def record_source(task: PartitionTask, record: Any, now_ms: int) -> tuple[Source, int]:
    """Where an input record came from, and the timestamp its clock guard reads: its own,
    or for a record without one the worker's clock."""
    timestamp_ms: int | None = record.timestamp
    source = Source(task.tp.topic, task.tp.partition, record.offset, timestamp_ms)
    if timestamp_ms is None or timestamp_ms < 0:
        timestamp_ms = now_ms
    return source, timestamp_ms


class Handing(Protocol):
    """How updates reach keyed partitions paired on this worker without the topic
    (app/exactly_once/handoff.py): ingest's; the pattern router has none."""

    def hand_update(self, update: WatermarkUpdate, now: float) -> set[int]:
        """Hand `update` to the open keyed partitions here; which they are."""
        ...

    def claimed_idle(self, source: int) -> None: ...


class EventTimeTeller:
    """The sources of one stage (partitions of `topics`, each a number below `count()`)
    and the keyed partitions (`partitions` of `keyed_topic`) it tells of them. Each
    source's committed progress is kept in `progress_table`, partitioned like the
    sources, so that stamps go on from it after a restart or a rebalance. `interval`:
    a source tells its progress at most this often (its watermark interval)."""

    def __init__(
        self,
        app: PairstreamApp,
        *,
        topics: Sequence[str],
        keyed_topic: str,
        partitions: int,
        number: Callable[[TP], int],
        count: Callable[[], int],
        progress_table: object,
        interval: float,
        handing: Handing | None = None,
    ) -> None:
        self.app = app
        self.topics = frozenset(topics)
        self.keyed_topic = keyed_topic
        self.partitions = partitions
        self.number = number
        self.count = count
        self._table = progress_table
        self.handing = handing
        conf = settings()
        self.interval = interval
        self.idle_timeout = conf.idle_timeout_seconds
        self.look_every = min(1.0, conf.idle_timeout_seconds / 2)

    # Progress, as committed

    def _key(self, task: PartitionTask) -> bytes:
        return b"~progress/%d" % self.number(task.tp)

    def load(self, task: PartitionTask) -> SourceProgress:
        """A source's progress, as last committed (a partition task's processor)."""
        raw = TableWriter(self._table, task).get(self._key(task))
        return SourceProgress(None if raw is None else int(raw), time.time())

    def source(self, task: PartitionTask) -> SourceProgress:
        return task.processor(SourceProgress, self.load)

    def store(self, task: PartitionTask, progress_us: int) -> None:
        """In a step of the source's task: once per run, as a run commits as one."""
        TableWriter(self._table, task).put(self._key(task), str(progress_us).encode())

    # What the keyed partitions are told

    def update(self, task: PartitionTask, source: SourceProgress) -> WatermarkUpdate:
        return source.update(self.number(task.tp), self.count())

    def records(self, update: WatermarkUpdate, handed: Container[int] = ()) -> list[Record]:
        """One watermark record for every keyed partition: marked for those in `handed`,
        which took the update from the hand-off and skip the record."""
        value = encode_watermark(update)
        keyed = self.keyed_topic
        return [
            (keyed, HANDED_WATERMARK_KEY if k in handed else WATERMARK_KEY, value, k)
            for k in range(self.partitions)
        ]

    def tell(self, task: PartitionTask, source: SourceProgress, now: float) -> list[Record]:
        """The source's progress, told now (no longer idle): its records."""
        update = source.announcement(self.number(task.tp), self.count(), now)
        handed = set() if self.handing is None else self.handing.hand_update(update, now)
        return self.records(update, handed)

    def before_commit(self, task: PartitionTask) -> list[Record]:
        """Committed progress reaches the keyed partitions in the same transaction, at
        most once per watermark interval."""
        source = task.loaded(SourceProgress)
        now = time.time()
        if source is None or not source.tell_due(now, self.interval):
            return []
        return self.tell(task, source, now)

    async def on_revoke(self, revoked: set[TP]) -> None:
        """Idle sources given up hold the watermark again (docs/event-time.md): told
        outside any transaction, like their idleness, and in the keyed partitions before
        the revocation ends, so before their next owner reads anything."""
        handed_over: list[tuple[TP, WatermarkUpdate]] = []
        for tp in sorted(revoked):
            task = self.app.partition_tasks.get(tp) if tp.topic in self.topics else None
            source = None if task is None else task.loaded(SourceProgress)
            if task is not None and source is not None and source.handed_over():
                handed_over.append((tp, self.update(task, source)))
        if not handed_over:
            return
        try:
            deliveries = []
            for _, update in handed_over:
                for topic, key, value, partition in self.records(update):
                    deliveries.append(
                        await self.app.producer.send(topic, key, value, partition, None, None)
                    )
            await asyncio.gather(*deliveries)
        except Exception as exc:  # a stop may have closed the producer: go on stopping
            log.warning(
                "idle sources %s handed over, but the keyed partitions of %s may not know:"
                " %r; their records that land before the next owner reads them can come"
                " out late",
                [tp for tp, _ in handed_over],
                self.keyed_topic,
                exc,
            )

    async def tell_caught_up(self) -> None:
        """Sources assigned here that are caught up tell the keyed partitions the
        progress their commits left untold (at most once per watermark interval), and
        once quiet for the idle timeout they stop holding the watermark back. Sent
        outside any transaction: a caught-up source has everything it processed
        committed, and claims no progress beyond that."""
        app = self.app
        if app.in_recovery or not app.partition_tasks.restored.is_set():
            return  # the stored progress may not be restored yet
        for task in list(app.partition_tasks):
            tp = task.tp
            if tp.topic not in self.topics:
                continue
            source = self.source(task)
            now = time.time()
            source.look(now, self.look_every)
            goes_idle = source.goes_idle(now, self.idle_timeout)
            if not goes_idle and not source.tell_due(now, self.interval):
                continue
            # Idle is the one claim here that can pass the records of others: where the
            # source ends is asked of the broker before it is made.
            if not await caught_up(app, tp, ask_broker=goes_idle):
                continue
            if goes_idle:
                source.went_idle()
                log.info(
                    "source %s is idle: it stops holding %s's watermark back",
                    tp,
                    self.keyed_topic,
                )
                update = self.update(task, source)
                if self.handing is not None:
                    # Read after what the source hands next, the claim is stale: the
                    # keyed partitions paired here skip it (app/exactly_once/handoff.py).
                    self.handing.claimed_idle(update.source)
            else:
                update = source.announcement(self.number(tp), self.count(), now)
            for topic, key, value, partition in self.records(update):
                await app.producer.send(topic, key, value, partition, None, None)
