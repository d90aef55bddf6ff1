"""The Faust app: broker, exactly-once processing, RocksDB tables, web server."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import faust
from faust.tables import TableManager
from mode import ServiceT

from app import internals
from app.consumer import ExactlyOnceTransport
from app.flow_queue import RebalanceSafeQueue
from app.input_partitions import PROGRESS_TABLE, InputSizedAssignor, size_at_start
from app.kafka_admin import wait_until_ready
from app.kafka_connection import KafkaConfigError
from app.partition_tasks import PartitionTasks
from app.settings import settings
from app.web_auth import token_middleware
from app.worker import PairstreamWorker, exit_for_config

if TYPE_CHECKING:
    from app.delivery import Dispatcher

log = logging.getLogger(__name__)


class PairstreamApp(faust.App):
    """faust.App with a transport whose commits never split an event (app/consumer.py),
    buffers a rebalance clears for good (app/flow_queue.py), the registry of this
    worker's partition tasks, and the delivery dispatcher."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.partition_tasks = PartitionTasks()
        self.delivery: Dispatcher | None = None  # set by agents/delivery.py when enabled

    def _new_transport(self) -> Any:
        return ExactlyOnceTransport(self.conf.broker_consumer, self)

    def _new_producer_transport(self) -> Any:
        return ExactlyOnceTransport(self.conf.broker_producer, self)

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
    if progress is not None:  # sized like the input topic as it is (app/input_partitions.py)
        await size_at_start(settings(), progress.changelog_topic)
    for table in tables.values():
        await table.changelog_topic.maybe_declare()
    conf = settings()
    changelogs = {
        table.changelog_topic.get_topic_name(): table.changelog_topic.partitions or conf.partitions
        for table in tables.values()
    }
    await wait_until_ready(conf, changelogs, conf.topics_ready_timeout_seconds)


def create_app() -> PairstreamApp:
    conf = settings()
    try:
        credentials = conf.kafka.faust_credentials()
    except KafkaConfigError as exc:
        exit_for_config(exc)
    if conf.bench_without_transactions:
        log.warning("PAIRSTREAM_BENCH_WITHOUT_TRANSACTIONS: at-least-once, outputs can repeat")
    return PairstreamApp(
        conf.app_id,
        broker=conf.broker,
        broker_credentials=credentials,
        processing_guarantee=(
            "at_least_once" if conf.bench_without_transactions else "exactly_once"
        ),
        store="rocksdb://",
        # Records and table values are bytes our own codecs write and read once.
        key_serializer="raw",
        value_serializer="raw",
        datadir=str(conf.data_dir),
        topic_partitions=conf.partitions,
        topic_replication_factor=conf.replication_factor,
        broker_commit_interval=conf.commit_interval_seconds,
        producer_linger=conf.producer_linger_seconds,
        producer_max_batch_size=conf.producer_batch_bytes,
        broker_session_timeout=conf.session_timeout_seconds,
        table_standby_replicas=conf.standby_replicas,
        broker_heartbeat_interval=conf.session_timeout_seconds / 4,
        consumer_group_instance_id=conf.group_instance_id,
        # faust's 5 minutes: a worker whose first metadata missed a just-created topic
        # was assigned none of its partitions, and stayed so until the next refresh.
        consumer_metadata_max_age_ms=int(conf.metadata_refresh_seconds * 1000),
        # Sends from a second thread would leave the transactions (faust issue 177).
        producer_threaded=False,
        # Wait for in-flight events before a rebalance commits.
        stream_wait_empty=True,
        web_host=conf.web_host,
        web_port=conf.web_port,
        canonical_url=conf.web_canonical_url or f"http://{conf.web_host}:{conf.web_port}",
        web_in_thread=False,
        # Every page behind the web token but the open ones, in one place (app/web_auth.py).
        web_application_options={
            "middlewares": [token_middleware(conf.web_token, conf.web_open_metrics)]
        },
        # Raw table data and the cluster's topology only when debugging.
        debug=conf.debug,
        web_tables_enabled=conf.debug,
        web_router_enabled=conf.debug,
        autodiscover=False,
        Worker=PairstreamWorker,
        TableManager=PairstreamTableManager,
        PartitionAssignor=InputSizedAssignor,
    )


app = create_app()


@app.on_rebalance_complete.connect
def _tables_restored(sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
    app.partition_tasks.restored.set()
