"""The worker class `faust -A app worker` runs (faust's `Worker` setting)."""

from __future__ import annotations

import gc
import logging
import os
import sys
import threading
from typing import Any, NoReturn, cast

import faust
from faust.types import AppT

from app.kafka.access import EX_CONFIG, KafkaAccessError, check_access, worker_permissions
from app.kafka.admin import (
    KeyedPartitionsMismatch,
    admin_client,
    check_keyed_partitions,
    ensure_topics,
)
from app.kafka.connection import KafkaConfigError
from app.kafka.replication import ClusterConfigUnreadable, replication_factor
from app.settings import settings

log = logging.getLogger(__name__)


class PairstreamWorker(faust.Worker):
    _exit_timer: threading.Timer | None = None

    def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
        # At -l warn and above faust's terminal spinner sets the root logger to DEBUG,
        # so that it spins on every record: every debug call of aiokafka then builds a
        # record (8.9% of CPU measured). No spinner; the level stays as asked.
        self.spinner = None
        super().on_setup_root_logger(logger, level)

    async def on_first_start(self) -> None:
        gc.set_threshold(*settings().gc_thresholds)
        # First faust's: it sets up logging (and nothing that joins or writes), so that a
        # start that fails says why in the log's own format.
        await super().on_first_start()
        await check_access_or_exit(self.app)
        # The broker does not auto-create topics: the outputs exist before the first send,
        # which an app task (started once the worker is ready) raced with.
        await ensure_topics(settings())

    async def on_startup_finished(self) -> None:
        await super().on_startup_finished()
        # What the start built (modules, services, topics) lives as long as the
        # process: no collection needs to look at it again.
        gc.freeze()

    async def stop(self) -> None:
        # On a thread, not the event loop: what holds a stop up can be the loop itself.
        if self._exit_timer is None:
            self._exit_timer = threading.Timer(settings().stop_grace_seconds, exit_now)
            self._exit_timer.daemon = True
            self._exit_timer.start()
        await super().stop()


async def check_access_or_exit(app: AppT) -> None:
    """Before anything joins or writes: a worker that cannot connect, lacks an ACL,
    finds the keyed topic with other than PAIRSTREAM_PARTITIONS partitions, or cannot
    learn the cluster's replication factor it is to create topics with, exits with
    EX_CONFIG and one line that says what to do, rather than retrying for
    ever (a supervisor can be told not to restart on that code)."""
    conf = settings()
    changelogs = [table.changelog_topic.get_topic_name() for table in app.tables.values()]
    try:
        await check_access(
            conf.kafka, worker_permissions(conf), changelogs, conf.topics_ready_timeout_seconds
        )
        tasks: Any = cast(Any, app).partition_tasks
        keyed = [conf.keyed_topic]
        if conf.patterns is not None and conf.patterns.input is not None:
            keyed += [*conf.patterns.input.topics, conf.pattern_events_topic]
        checked = {name for k in keyed for name in (k, *tasks.changelogs.get(k, ()))}
        await check_keyed_partitions(conf, sorted(checked))
        async with admin_client(conf) as admin:
            # What faust creates the changelogs and internal topics with (app/kafka/replication.py).
            app.conf.topic_replication_factor = await replication_factor(conf, admin)
    except (
        KafkaAccessError,
        KafkaConfigError,
        KeyedPartitionsMismatch,
        ClusterConfigUnreadable,
    ) as exc:
        exit_for_config(exc)


# The worker's log format (mode's, as faust sets it up): for a line logged before that.
LOG_FORMAT = "[%(asctime)s] [%(process)s] [%(levelname)s] %(message)s"


def exit_for_config(exc: Exception) -> NoReturn:
    """One line that says what is wrong, at CRITICAL in the worker's log format, and
    EX_CONFIG: nothing was started yet."""
    if not logging.getLogger().handlers:  # the settings were refused before faust's set-up
        logging.basicConfig(format=LOG_FORMAT)
    log.critical("cannot start: %s", exc)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(EX_CONFIG)


def exit_now() -> None:
    """End a stop that has not ended within its grace: as kill -9 would, and as safely
    (the fault matrix): the broker aborts the open transactions."""
    log.error("still stopping %.0f s later: exiting now", settings().stop_grace_seconds)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # the worker's log
    os._exit(1)
