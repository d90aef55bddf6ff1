"""One pairstream worker (`faust -A app worker`, exactly-once) over a pre-produced
input: how fast both stages get through it, read off the worker's /stats."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp

from app.kafka.admin import ensure_topics
from app.settings import Settings
from bench import profile
from bench.measure import Samples, cpu_seconds
from bench.stalls import log_excerpt, stalled_worker
from bench.workload import INPUT_PARTITIONS, delete_topics, pre_produce
from tools.demo import run_settings, start_worker, stop_worker, wait_ready
from tools.generate import Record
from tools.ports import free_port


@dataclass(frozen=True)
class PairstreamResult:
    commit_interval: float
    events: int
    steady_rate: float  # events/s through both stages, between 10% and 90%
    through_rate: float  # events/s through both stages, from the first through to the last
    seconds: float  # worker start to the last event through both stages
    first_through: float | None  # worker start to the first event through both stages
    cpu_seconds: float  # of the worker process
    profile: profile.Profile | None  # py-spy, from ready to the last event through


@dataclass(frozen=True)
class WorkerRun:
    """Fresh topics and settings for one benchmark worker; its log; its /stats; the
    settings for its process alone (`start_worker(log_path, env)`)."""

    conf: Settings
    log_path: Path
    stats_url: str
    env: dict[str, str]

    async def discard(self) -> None:
        """What a run that succeeded leaves behind: its topics, state and logs."""
        run_dir = Path(self.conf.data_dir)
        await delete_topics(self.conf.kafka.bootstrap_servers, run_dir.name)  # the run id
        discard_run(run_dir)


def discard_run(path: Path) -> None:
    """Delete what a run that succeeded left under .run/: its state directories and
    logs, all named after it (a suite run left hundreds, over a GiB). A run that fails
    keeps them to look at."""
    for left in path.parent.glob(f"{path.name}*"):
        if left.is_dir():
            shutil.rmtree(left)
        else:
            left.unlink()


def worker_run(
    kind: str, bootstrap: str, commit_interval: float, extra: dict[str, str] | None = None
) -> WorkerRun:
    """Settings for a worker of its own run id, put in this process's environment, which
    the worker started by `start_worker` inherits; `extra` only in the run's `env`, as
    a later run would inherit it too (each run sets the others anew). `conf` is without
    `extra`."""
    run_id = f"{kind}-{uuid.uuid4().hex[:8]}"
    port = free_port()
    os.environ.update(
        {
            **run_settings(run_id),
            "PAIRSTREAM_BROKER": f"kafka://{bootstrap}",
            "PAIRSTREAM_EVENTS_PARTITIONS": str(INPUT_PARTITIONS),
            "PAIRSTREAM_COMMIT_INTERVAL_SECONDS": str(commit_interval),
            "PAIRSTREAM_WEB_PORT": str(port),
        }
    )
    conf = Settings()
    log_path = Path(conf.data_dir).with_name(f"{run_id}-worker.log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    return WorkerRun(conf, log_path, f"http://127.0.0.1:{port}/stats", extra or {})


def settings_fields(env: dict[str, str]) -> dict[str, str]:
    """Settings given as PAIRSTREAM_ variables, as keyword arguments of `Settings`."""
    return {name.removeprefix("PAIRSTREAM_").lower(): value for name, value in env.items()}


async def worker_stats(url: str) -> dict[str, Any]:
    """The worker's /stats."""
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        stats: dict[str, Any] = await response.json()
    return stats


async def worker_commits(url: str) -> tuple[int, float]:
    """The worker's commits so far and their seconds in all, per its /stats."""
    commits = (await worker_stats(url))["worker"]["commit_seconds"]
    return commits["count"], commits["sum"]


async def through_pairing(url: str) -> int:
    """Keyed events the pairing stage has processed, per the worker's /stats."""
    stats = await worker_stats(url)
    keyed = os.environ["PAIRSTREAM_KEYED_TOPIC"]
    return sum(
        p["counters"]["events_in"]
        for p in stats["partitions"]
        if p["topic"] == keyed and p["role"] == "active"
    )


async def run_worker(
    bootstrap: str,
    records: list[Record],
    commit_interval: float,
    timeout: float,
    profile_to: Path | None = None,
    transactions: bool = True,
    setup: Callable[[Settings], dict[str, str]] | None = None,
    through: Callable[[str], Awaitable[int]] = through_pairing,
    drain: Callable[[Settings, int], Awaitable[float]] | None = None,
) -> PairstreamResult:
    """Run one worker over `records`; with `profile_to`, under py-spy, raw output there;
    without `transactions`, at-least-once (PAIRSTREAM_BENCH_WITHOUT_TRANSACTIONS);
    `setup`: more settings for the worker, from the run's (the input is produced to the
    run's events topic before); `through`: events through,
    from the worker's /stats URL; `drain`: for a stage whose work on an event comes
    after it is counted through, given the run's settings and the worker's pid, when
    (time.monotonic) that work ended: the last event is through then."""
    extra = {} if transactions else {"PAIRSTREAM_BENCH_WITHOUT_TRANSACTIONS": "true"}
    run = worker_run("bench", bootstrap, commit_interval, extra)
    await pre_produce(bootstrap, run.conf.events_topic, records)  # before `setup` moves it
    if setup is not None:
        more = setup(run.conf)
        run.env.update(more)
        run = replace(run, conf=Settings(**{**run.conf.model_dump(), **settings_fields(more)}))
    await ensure_topics(run.conf)
    log_path = run.log_path
    worker = start_worker(log_path, run.env)
    started = time.monotonic()
    recorder = None
    try:
        await wait_ready(log_path, worker)
        if profile_to is not None:
            recorder = profile.start(worker.pid, profile_to)
        progress = Samples()
        done = 0
        while True:
            try:
                done = await through(run.stats_url)
            except aiohttp.ClientError:
                # A dying worker closes its port a moment before it exits.
                with suppress(subprocess.TimeoutExpired):
                    worker.wait(timeout=5)
                if worker.returncode is None:
                    raise
                raise RuntimeError(
                    f"the worker exited ({worker.returncode}) after {done} of {len(records)}"
                    f" events; its log:\n{log_excerpt(log_path)}"
                ) from None
            elapsed = time.monotonic() - started
            progress.samples.append((elapsed, done))
            if done >= len(records):
                break
            if elapsed > timeout:
                raise TimeoutError(
                    f"{done} of {len(records)} events through in {elapsed:.0f} s\n"
                    + stalled_worker(worker.pid, log_path)
                )
            await asyncio.sleep(0.25)
        if drain is not None:
            ended = await drain(run.conf, worker.pid)
            progress.samples[-1] = (ended - started, progress.samples[-1][1])
        cpu = cpu_seconds(worker.pid)
    finally:
        if recorder is not None:
            profile.stop(recorder)
        stop_worker(worker)
    await run.discard()
    summary = None
    if profile_to is not None and profile_to.exists():
        summary = profile.summarize(profile_to.read_text())
    return PairstreamResult(
        commit_interval,
        len(records),
        progress.steady_rate(len(records)),
        progress.through_rate(len(records)),
        progress.samples[-1][0],
        progress.first_at(),
        cpu,
        summary,
    )
