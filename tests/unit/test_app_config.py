"""Settings that reach faust's configuration."""

import asyncio
import gc
import os
import threading
from pathlib import Path

import faust
import pytest

from app import worker as worker_module
from app.faust_app import app, create_app
from app.settings import Settings, settings
from app.worker import PairstreamWorker
from pairing.patterns import PatternError
from tables.pairing_state import table


def test_the_consumer_refreshes_metadata_as_configured() -> None:
    # faust's default (5 minutes) left a worker that missed a just-created topic
    # without its partitions for that long.
    refresh_ms = settings().metadata_refresh_seconds * 1000
    assert app.conf.consumer_metadata_max_age_ms == refresh_ms < 5 * 60 * 1000


def test_static_membership_is_off_unless_a_worker_is_given_an_instance_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert app.conf.consumer_group_instance_id is None
    monkeypatch.setenv("PAIRSTREAM_GROUP_INSTANCE_ID", "pairstream-2")
    settings.cache_clear()
    try:
        assert create_app().conf.consumer_group_instance_id == "pairstream-2"
    finally:
        settings.cache_clear()


def test_producers_gather_records_for_the_configured_linger(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # faust's 0 made a produce request for every record or two.
    assert app.conf.producer_linger == settings().producer_linger_seconds > 0
    monkeypatch.setenv("PAIRSTREAM_PRODUCER_LINGER_SECONDS", "0.02")
    settings.cache_clear()
    try:
        fresh = create_app()
        assert fresh.producer.linger_ms == 20  # what aiokafka is given, transactions too
    finally:
        settings.cache_clear()


def test_the_benchmark_switch_turns_transactions_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert app.conf.processing_guarantee.value == "exactly_once"
    monkeypatch.setenv("PAIRSTREAM_BENCH_WITHOUT_TRANSACTIONS", "true")
    settings.cache_clear()
    try:
        fresh = create_app()
        assert fresh.conf.processing_guarantee.value == "at_least_once"
        assert not fresh.in_transaction
    finally:
        settings.cache_clear()


@pytest.mark.parametrize("faust_sensor", [False, True])
def test_faust_s_monitor_sees_events_only_when_its_sensor_is_asked_for(
    monkeypatch: pytest.MonkeyPatch, faust_sensor: bool
) -> None:
    # faust calls every sensor for each record, event and send (no
    # per-event sensors on the hot path).
    monkeypatch.setenv("PAIRSTREAM_FAUST_SENSOR", str(faust_sensor).lower())
    settings.cache_clear()
    try:
        fresh = create_app()
        list(fresh.on_init_dependencies())
        assert (fresh.monitor in set(fresh.sensors)) is faust_sensor
    finally:
        settings.cache_clear()


def test_tables_open_rocksdb_with_the_configured_write_buffer() -> None:
    # faust's 64 MiB memtable was replayed from the write-ahead log at every restart
    # after a kill: 0.8 s a partition with 250,000 keys pending.
    configured = settings().rocksdb_write_buffer_bytes
    assert table.data.rocksdb_options.write_buffer_size == configured < 64 * 2**20


async def test_a_worker_sets_the_collector_s_thresholds_and_freezes_its_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Python's (700, 10, 10) cost about a sixth of a worker's CPU.
    async def nothing(self: object) -> None:
        pass

    async def allowed(app: object) -> None:
        pass

    monkeypatch.setattr(faust.Worker, "on_first_start", nothing)
    monkeypatch.setattr(faust.Worker, "on_startup_finished", nothing)
    monkeypatch.setattr(worker_module, "check_access_or_exit", allowed)
    monkeypatch.setattr(worker_module, "ensure_topics", allowed)
    monkeypatch.setenv("PAIRSTREAM_GC_THRESHOLDS", "[5000, 7, 9]")
    before = gc.get_threshold()
    settings.cache_clear()
    worker = PairstreamWorker.__new__(PairstreamWorker)
    worker.app = app
    try:
        await worker.on_first_start()
        assert gc.get_threshold() == (5000, 7, 9)
        gc.unfreeze()
        await worker.on_startup_finished()
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
        settings.cache_clear()


def test_producers_gather_a_partition_s_records_into_batches_of_the_configured_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # faust's 16 KiB: a step waited for a full batch to drain every 60-80 records.
    assert app.conf.producer_max_batch_size == settings().producer_batch_bytes > 16 * 1024
    monkeypatch.setenv("PAIRSTREAM_PRODUCER_BATCH_BYTES", "65536")
    settings.cache_clear()
    try:
        fresh = create_app()
        assert fresh.producer.max_batch_size == 65536  # aiokafka's, transactions too
    finally:
        settings.cache_clear()


async def test_a_stop_not_ended_within_its_grace_exits_the_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stop_forever = asyncio.Event()

    async def hanging_stop(self: object) -> None:
        await stop_forever.wait()

    exited: list[int] = []
    exit_called = threading.Event()

    def fake_exit(code: int) -> None:
        exited.append(code)
        exit_called.set()

    monkeypatch.setattr(faust.Worker, "stop", hanging_stop)
    monkeypatch.setattr(os, "_exit", fake_exit)
    monkeypatch.setenv("PAIRSTREAM_STOP_GRACE_SECONDS", "0.2")
    settings.cache_clear()
    worker = PairstreamWorker.__new__(PairstreamWorker)
    stopping = asyncio.ensure_future(worker.stop())
    try:
        await asyncio.sleep(0)  # the stop has begun
        assert worker._exit_timer is not None and worker._exit_timer.interval == 0.2
        assert await asyncio.to_thread(exit_called.wait, 5)
        assert exited == [1]
    finally:
        stopping.cancel()
        settings.cache_clear()


def test_a_pattern_file_that_reads_another_stages_input_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "patterns.toml"
    pattern = '[[pattern]]\nname = "p"\nkey = "k"\nwithin = 1\n[[pattern.step]]\nname = "s"\n'
    path.write_text(f'[input]\ntopics = ["clicks", "events"]\n{pattern}')
    with pytest.raises(PatternError, match="topic 'events' is pairing's input"):
        _ = Settings(patterns_file=path).patterns
    path.write_text(f'[input]\ntopics = ["clicks", "unpaired"]\n{pattern}')
    declared = Settings(patterns_file=path).patterns
    assert declared is not None and declared.input is not None
    assert declared.input.topics == ("clicks", "unpaired")
