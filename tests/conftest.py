from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from app.settings import Settings
from tests.integration.image_build import ImageBuild, missing_tools
from tools import broker as local_broker
from tools import postgres
from tools.ports import free_port

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

CONTAINER_TEST = "tests/integration/test_container.py"

BROKER_PORT = int(os.environ.get("PAIRSTREAM_TEST_BROKER_PORT", "9092"))


def broker_nodes() -> list[local_broker.Node]:
    """The test broker, for the fixture and for the faults that kill it."""
    # Its own data dir per port, so test sessions on different ports can run side by side.
    name = "kafka" if BROKER_PORT == 9092 else f"kafka-{BROKER_PORT}"
    return local_broker.cluster(1, BROKER_PORT, name)


@pytest.fixture(scope="session")
def broker() -> Iterator[str]:
    """A real Kafka broker: the running local one, or one started for this session."""
    nodes = broker_nodes()
    started = False
    if not asyncio.run(local_broker._cluster_answers(nodes)):
        if not any(local_broker.alive(node) for node in nodes):
            # Started afresh: the topics of earlier sessions (GiBs after a long fault
            # matrix) slowed its start and its transactions, and only fill the disk.
            local_broker.clean(nodes[0].name)
        local_broker.start(nodes, timeout=120)
        started = True
    yield local_broker.bootstrap_servers(nodes)
    if started:
        local_broker.stop(nodes, hard=False)


SECURE_PORT = int(os.environ.get("PAIRSTREAM_TEST_SECURE_PORT", local_broker.SECURE_PORT))


@pytest.fixture(scope="session")
def secure_broker() -> Iterator[list[local_broker.Node]]:
    """The secured broker (SASL_SSL, SCRAM users, ACLs): the running one, or one
    started for this session."""
    name = "kafka-secure" if SECURE_PORT == local_broker.SECURE_PORT else f"kafka-{SECURE_PORT}"
    nodes = local_broker.cluster(1, SECURE_PORT, name, secure=True)
    started = False
    if not any(local_broker.alive(node) for node in nodes):
        local_broker.clean(name)
        local_broker.start(nodes, timeout=120)
        started = True
    yield nodes
    if started:
        local_broker.stop(nodes, hard=False)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One local Spark session for every test that reads or writes the lake."""
    from analytics.spark import spark_session  # the analytics extra: not for unit runs

    session = spark_session(Settings(), "pairstream-tests", "local[2]")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def database() -> Iterator[postgres.Cluster]:
    """The events table in a PostgreSQL cluster of the module's own (tools/postgres.py)."""
    cluster = postgres.Cluster(f"test-{uuid.uuid4().hex[:8]}", free_port())
    postgres.start(cluster)
    yield cluster
    postgres.clean(cluster)


IMAGE_BUILD = pytest.StashKey[ImageBuild]()


def pytest_collection_finish(session: pytest.Session) -> None:
    """The container test's image starts building now, not in the test's set-up."""
    wanted = any(item.nodeid.startswith(CONTAINER_TEST) for item in session.items)
    if wanted and not missing_tools():
        session.config.stash[IMAGE_BUILD] = ImageBuild()


def pytest_sessionfinish(session: pytest.Session) -> None:
    build = session.config.stash.get(IMAGE_BUILD, None)
    if build is not None:
        build.cancel()
        build.remove_image()


@pytest.fixture(scope="session")
def image_build(pytestconfig: pytest.Config) -> ImageBuild:
    """The image build started with the session (or now, for a session that did not
    collect the container test by its path)."""
    missing = missing_tools()
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed, and `make podman` could not install it")
    if IMAGE_BUILD not in pytestconfig.stash:
        pytestconfig.stash[IMAGE_BUILD] = ImageBuild()
    return pytestconfig.stash[IMAGE_BUILD]
