"""The worker image, built on the local base image, run as two containers against the
test broker: one is killed with SIGKILL mid-stream and started again, and the outputs
must still be the reference model's, each once (the fault matrix's checks)."""

from __future__ import annotations

import asyncio
import random
import subprocess
import time
from pathlib import Path
from typing import IO

import pytest

from tests.integration.faults import kill_worker
from tests.integration.harness import Pipeline, Worker
from tests.integration.image_build import ImageBuild
from tests.integration.scenarios import Fault, World, run_scenario
from tools import container
from tools.generate import StreamShape, generate

pytestmark = [pytest.mark.broker, pytest.mark.fault]

DATA_DIR = "/var/lib/pairstream"  # the image's volume
RECORDS = 8_000
RATE = 400.0  # events per second: the kill strikes while events flow
BUILD_TIMEOUT_SECONDS = 600.0


@pytest.fixture(scope="module")
def image(image_build: ImageBuild) -> str:
    """The worker image, built since the session began (tests/integration/image_build.py),
    removed when the session ends."""
    started = time.monotonic()
    tag = image_build.wait(BUILD_TIMEOUT_SECONDS)
    print(f"\n{image_build.tail(1)}; waited {time.monotonic() - started:.0f} s for it")
    return tag


class ContainerPipeline(Pipeline):
    """A pipeline whose workers are containers of `image`."""

    def __init__(self, image: str, bootstrap: str, tmp: Path, **overrides: str) -> None:
        super().__init__(bootstrap, tmp, **overrides)
        self.image = image
        self.workers: list[ContainerWorker] = []

    def worker(self, index: int = 0) -> Worker:
        worker = ContainerWorker(self, index)
        self.workers.append(worker)
        return worker


class ContainerWorker(Worker):
    """`podman run` of the image in the foreground: its output is the worker's log,
    its exit the container's; signals go to the container through podman."""

    pipeline: ContainerPipeline

    def __init__(self, pipeline: ContainerPipeline, index: int) -> None:
        super().__init__(pipeline, index)
        self.name = f"{pipeline.env_vars['PAIRSTREAM_APP_ID']}-{index}"

    def environment(self) -> dict[str, str]:
        return {
            **super().environment(),
            "PAIRSTREAM_DATA_DIR": DATA_DIR,
            "PAIRSTREAM_WEB_CANONICAL_URL": f"http://127.0.0.1:{self.web_port}",
        }

    def _launch(self, log: IO[bytes]) -> subprocess.Popen[bytes]:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = [f"--env={name}={value}" for name, value in self.environment().items()]
        command = [
            "podman", "--runtime", "runc", "run", "--rm", "--replace", "--name", self.name,
            "--network", "host", *container.ULIMITS, *env,
            # :U hands the host folder to the image's user, as a volume of its own would be
            "--volume", f"{self.data_dir}:{DATA_DIR}:U",
            # As deploy/workers.yaml runs it: a read-only root, /tmp its own, no capability.
            "--read-only", "--read-only-tmpfs", "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges",
            # No timer (no systemd here): the test runs the image's health check itself.
            "--health-interval", "disable",
            self.pipeline.image,
        ]  # fmt: skip
        return subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def _send(self, sig: int) -> None:
        # The podman client in front does not pass SIGKILL on: the container is signalled.
        container.podman("kill", "--signal", str(sig), self.name, check=False, capture=True)

    def exec(self, *command: str) -> str:
        return container.podman("exec", self.name, *command, capture=True).stdout.strip()

    async def wait_healthy(self, timeout: float = 120) -> None:
        """The image's HEALTHCHECK passes (it is run here, once a poll)."""
        deadline = time.monotonic() + timeout
        while True:
            check = container.podman("healthcheck", "run", self.name, check=False, capture=True)
            if check.returncode == 0:
                return
            assert time.monotonic() < deadline, f"{self.name} unhealthy: {check}\n{self.log()}"
            await asyncio.sleep(1)  # polling the health check, as podman's timer would


def check_containers(at: float) -> Fault:
    """Every worker container is healthy and runs as the image's user, not root."""

    async def act(world: World) -> None:
        for worker in world.workers:
            assert isinstance(worker, ContainerWorker)
            await worker.wait_ready()
            await worker.wait_healthy()
            assert worker.exec("id", "-u") == "10001"
            assert worker.exec("id", "-g") == "10001"
            assert worker.exec("id", "-un") == "pairstream"

    return Fault(at, f"containers healthy, not root @{at:.0%}", act)


async def test_two_worker_containers_one_killed(image: str, broker: str, tmp_path: Path) -> None:
    pipeline = await ContainerPipeline(image, broker, tmp_path).create_topics()
    seed = random.randrange(1 << 30)
    print(f"seed {seed}, {RECORDS} records")
    records = generate(StreamShape(count=RECORDS, seed=seed))
    faults = [check_containers(0.1), kill_worker(0.4, index=1), check_containers(0.7)]
    try:
        report = await run_scenario(pipeline, records, faults, seed=seed, workers=2, rate=RATE)
    finally:
        for worker in pipeline.workers:
            container.podman("rm", "--force", "--ignore", worker.name, capture=True)
    assert report.problems == {}, report.problems
    assert "kill -9 worker 1 @40%" in report.recovery_s, report.recovery_s
