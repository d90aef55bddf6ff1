"""The faults a scenario can inject, as `Fault` actions."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal

from tests.integration.harness import stop_workers
from tests.integration.scenarios import Fault, World
from tools import broker as local_broker


def kill_worker(at: float, index: int = 0, lose_local_state: bool = False) -> Fault:
    """SIGKILL a worker and start it again, optionally without its data dir."""

    async def act(world: World) -> None:
        worker = world.workers[index]
        # Land anywhere in the commit cycle, not just after the reader saw progress.
        await asyncio.sleep(random.uniform(0, world.pipeline.conf.commit_interval_seconds))
        worker.kill()
        if lose_local_state:
            shutil.rmtree(worker.data_dir, ignore_errors=True)
        worker.start()

    name = "kill -9 worker, lose its RocksDB" if lose_local_state else "kill -9 worker"
    return Fault(at, f"{name} {index} @{at:.0%}", act)


def scale_out(at: float, count: int) -> Fault:
    async def act(world: World) -> None:
        for _ in range(count):
            world.add_worker()

    return Fault(at, f"scale out +{count} @{at:.0%}", act)


def scale_in(at: float, indexes: list[int]) -> Fault:
    async def act(world: World) -> None:
        await stop_workers([world.workers[index] for index in indexes])

    return Fault(at, f"scale in -{len(indexes)} @{at:.0%}", act)


def pause_worker(at: float, index: int, seconds: float) -> Fault:
    """SIGSTOP, then SIGCONT: a worker that looks dead, then comes back as a zombie."""

    async def act(world: World) -> None:
        process = world.workers[index].process
        assert process is not None
        os.killpg(process.pid, signal.SIGSTOP)
        await asyncio.sleep(seconds)  # the fault's duration, not a synchronisation
        os.killpg(process.pid, signal.SIGCONT)

    return Fault(at, f"SIGSTOP worker {index} {seconds:.0f}s @{at:.0%}", act)


def kill_broker(at: float, nodes: list[local_broker.Node], restart: bool) -> Fault:
    """SIGKILL broker nodes; with restart, start them again at once."""

    async def act(world: World) -> None:
        # A fault that kills nothing must not pass for one (it did, for a node
        # described with another data dir than the running broker's).
        assert all(local_broker.alive(n) for n in nodes), f"not running: {nodes}"
        local_broker.stop(nodes, hard=True)
        if restart:
            await asyncio.to_thread(local_broker.start, nodes, 180)

    ids = ",".join(str(n.node_id) for n in nodes)
    return Fault(at, f"kill -9 broker {ids}{' and restart' if restart else ''} @{at:.0%}", act)


def start_broker(
    at: float, nodes: list[local_broker.Node], cluster: list[local_broker.Node]
) -> Fault:
    async def act(world: World) -> None:
        await asyncio.to_thread(local_broker.start, nodes, 180, cluster)

    ids = ",".join(str(n.node_id) for n in nodes)
    return Fault(at, f"restart broker {ids} @{at:.0%}", act)
