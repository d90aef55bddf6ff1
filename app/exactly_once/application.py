"""faust.App with the exactly-once core plugged in: a transport whose commits never
split an event (transport.py), buffers a rebalance clears for good (flow_queue.py),
the registry of this worker's partition tasks, and a table manager that waits for
its changelogs. app/faust_app.py configures and builds the one instance."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import faust
from faust.tables import TableManager
from mode import ServiceT
from mode.utils.objects import cached_property

from app.exactly_once import internals
from app.exactly_once.flow_queue import RebalanceSafeQueue, ResumeKeepsFetchedFlowControl
from app.exactly_once.input_partitions import PROGRESS_TABLE, InputSize, size_at_start
from app.exactly_once.partition_tasks import PartitionTasks
from app.exactly_once.transport import ExactlyOnceTransport
from app.kafka.admin import admin_client, wait_until_ready
from app.kafka.replication import warn_if_weakly_replicated
from app.settings import settings


class PairstreamApp(faust.App):
    """faust.App with a transport whose commits never split an event (transport.py),
    buffers a rebalance clears for good (flow_queue.py), and the registry of this
    worker's partition tasks."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.partition_tasks = PartitionTasks(settings().sizes)
        # The input topic's partition count as this worker has seen it (input_partitions.py).
        self.input_size = InputSize(settings().events_partitions)

    def _new_transport(self) -> Any:
        return ExactlyOnceTransport(self.conf.broker_consumer, self)

    def _new_producer_transport(self) -> Any:
        return ExactlyOnceTransport(self.conf.broker_producer, self)

    @cached_property
    def flow_control(self) -> ResumeKeepsFetchedFlowControl:
        return ResumeKeepsFetchedFlowControl(loop=self.loop)

    def FlowControlQueue(
        self, maxsize: int | None = None, *, clear_on_resume: bool = False
    ) -> RebalanceSafeQueue[Any]:
        return RebalanceSafeQueue(
            maxsize or 0, flow_control=self.flow_control, clear_on_resume=clear_on_resume
        )

    def on_init_dependencies(self) -> Iterable[ServiceT]:
        dependencies = super().on_init_dependencies()
        if not settings().faust_sensor:
            # faust calls its monitor for every record, event and send: per-event
            # work on the hot path, for figures /stats and /metrics have of their own.
            self.sensors.remove(self.monitor)
        return dependencies


class PairstreamTableManager(TableManager):
    async def on_start(self) -> None:
        # faust's waits a second first, for tables that agents create as they start;
        # ours are all declared when the app is imported. That second was a fifth of
        # the time from a worker's start to its first output.
        if not self.should_stop:
            await changelogs_ready(self)
            await internals.take_tables_on(self)
            await self.recovery.start()


async def changelogs_ready(tables: TableManager) -> None:
    """Declare the tables' changelogs (created, on a new app) and wait until the broker
    shows them, before the tables are taken on: the consumer subscribes to them and
    joins the group right after, and an assignment made while its metadata lacked a
    changelog leaves that one's partitions out. The tables then start empty, with no
    restore (two workers starting together lost 96 of 1,436 pairs so)."""
    progress = tables.get(PROGRESS_TABLE)
    if progress is not None:  # sized like the input topic as it is (input_partitions.py)
        app: PairstreamApp = tables.app  # type: ignore[assignment]
        await size_at_start(settings(), progress.changelog_topic, app.input_size)
    for table in tables.values():
        await table.changelog_topic.maybe_declare()
    conf = settings()
    changelogs = {
        table.changelog_topic.get_topic_name(): table.changelog_topic.partitions or conf.partitions
        for table in tables.values()
    }
    await wait_until_ready(conf, changelogs, conf.topics_ready_timeout_seconds)
    async with admin_client(conf) as admin:
        await warn_if_weakly_replicated(admin, [*changelogs, conf.keyed_topic])
