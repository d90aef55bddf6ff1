"""The one Faust app of a worker, configured from the settings: broker, exactly-once
processing, RocksDB tables, web server. app/main.py plugs the stages and the web in."""

from __future__ import annotations

import logging
from typing import Any

from app.exactly_once.application import PairstreamApp, PairstreamTableManager
from app.exactly_once.input_partitions import InputSizedAssignor
from app.kafka.connection import KafkaConfigError
from app.settings import settings
from app.worker import PairstreamWorker, exit_for_config
from pairing.patterns import PatternError

log = logging.getLogger(__name__)


def create_app() -> PairstreamApp:
    conf = settings()
    try:
        credentials = conf.kafka.faust_credentials()
        conf.patterns  # noqa: B018  (a bad pattern file: refused before anything starts)
    except (KafkaConfigError, PatternError) as exc:
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
        # Unset: the cluster's default, read at the start (app/worker.py) before any topic is made.
        topic_replication_factor=conf.replication_factor or 1,
        broker_commit_interval=conf.commit_interval_seconds,
        producer_linger=conf.producer_linger_seconds,
        producer_max_batch_size=conf.producer_batch_bytes,
        # Room past the largest record for its batch's framing (docs/grammar.md, "Sizes").
        producer_max_request_size=max(1_000_000, conf.max_record_bytes + 16_384),
        broker_session_timeout=conf.session_timeout_seconds,
        table_standby_replicas=conf.standby_replicas,
        broker_heartbeat_interval=conf.session_timeout_seconds / 4,
        consumer_group_instance_id=conf.group_instance_id,
        # faust's 5 minutes: a worker whose first metadata missed a just-created topic
        # was assigned none of its partitions, and stayed so until the next refresh.
        consumer_metadata_max_age_ms=int(conf.metadata_refresh_seconds * 1000),
        # Sends from a second thread would leave the transactions (faust-streaming issue 177).
        producer_threaded=False,
        # Wait for in-flight events before a rebalance commits.
        stream_wait_empty=True,
        web_host=conf.web_host,
        web_port=conf.web_port,
        canonical_url=conf.web_canonical_url or f"http://{conf.web_host}:{conf.web_port}",
        web_in_thread=False,
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
