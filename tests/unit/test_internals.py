"""Each private member of faust-streaming and aiokafka that app/internals.py names is
still there and still does what we rely on, in the installed versions. No broker:
the app's real consumer and producer classes, with fakes where they would connect."""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any

import pytest
from faust.exceptions import ConsumerNotStarted
from faust.types import TP, Message

from app import internals
from app.consumer import ExactlyOnceConsumer, ExactlyOnceConsumerThread, ExactlyOnceProducer
from app.faust_app import PairstreamApp, app
from app.worker import PairstreamWorker
from tables.pairing_state import table
from tests.unit.conftest import Transactions

OURS: list[type] = [
    ExactlyOnceConsumer,
    ExactlyOnceConsumerThread,
    ExactlyOnceProducer,
    PairstreamApp,
    PairstreamWorker,
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
    theirs = inspect.signature(getattr(base, name))
    assert tuple(theirs.parameters)[: len(parameters)] == parameters
    assert name in overriding(base).__dict__, f"{name} is listed but not overridden"


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
