"""On the secured broker (SASL_SSL, SCRAM-SHA-512, ACLs): a worker, the Spark jobs and
the tools that cannot connect, or lack an ACL, exit with EX_CONFIG and one line that
says what to do, having written nothing."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from faust.types import TP

from app.exactly_once.handoff import FENCE_KEY
from app.kafka.access import EX_CONFIG, Pattern, Permission, ResourceType, worker_permissions
from app.kafka.admin import end_offsets
from tests.integration.harness import ROOT, Pipeline, read_partitions, secured_pipeline
from tools import broker as local_broker
from tools.broker_security import make_ca
from tools.kafka_acls import grant, revoke

pytestmark = [pytest.mark.broker]

EXIT_WITHIN_SECONDS = 30.0  # the bound the worker must stop in: it must not retry on


async def exits(pipeline: Pipeline) -> tuple[int, str]:
    """Start a worker; its exit code and its log, once it exited by itself."""
    worker = pipeline.worker().start()
    assert worker.process is not None
    deadline = time.monotonic() + EXIT_WITHIN_SECONDS
    while worker.process.poll() is None:
        if time.monotonic() > deadline:
            worker.kill()
            raise AssertionError(f"still running after {EXIT_WITHIN_SECONDS}s:\n{worker.log()}")
        await asyncio.sleep(0.2)  # polling the process
    return worker.process.returncode, worker.log()


def reason(log: str) -> str:
    """The one line that says why the worker did not start."""
    [line] = [line for line in log.splitlines() if "cannot start:" in line]
    return line


async def nothing_written(pipeline: Pipeline) -> dict[TP, int]:
    """No output, and no data in the keyed topic: at most the hand-off's fences of a
    worker that started (docs/exactly-once.md). The topics' end offsets, to compare."""
    conf = pipeline.conf
    topics = [conf.keyed_topic, conf.pairs_topic, conf.unpaired_topic, conf.dead_letter_topic]
    ends = await end_offsets(conf, [TP(t, p) for t in topics for p in range(conf.partitions)])
    assert {n for tp, n in ends.items() if tp.topic != conf.keyed_topic} == {0}, ends
    keyed = await read_partitions(conf, conf.keyed_topic)
    assert {key for partition in keyed for key, _ in partition} <= {FENCE_KEY}, keyed
    return ends


def settings_file(tmp: Path, name: str, text: str) -> str:
    path = tmp / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    "fault",
    [
        "wrong password",
        "untrusted CA",
        "hostname mismatch",
        "TLS without SASL to a SASL_SSL port",
        "SASL without a username",
        "a SASL mechanism the broker does not enable",
    ],
)
async def test_a_worker_that_cannot_connect_says_why_and_exits(
    secure_broker: list[local_broker.Node], tmp_path: Path, fault: str
) -> None:
    pipeline = await secured_pipeline(secure_broker, tmp_path)
    port = secure_broker[0].port
    wrong, expected = {
        "wrong password": (
            {"PAIRSTREAM_KAFKA_PASSWORD_FILE": settings_file(tmp_path, "pw", "not-it\n")},
            "refused user 'worker'",
        ),
        "untrusted CA": (
            {"PAIRSTREAM_KAFKA_CA_FILE": str(make_ca(tmp_path / "other-ca", "another CA"))},
            f"the broker's certificate at 127.0.0.1:{port} is not trusted",
        ),
        "hostname mismatch": (
            {"PAIRSTREAM_BROKER": f"kafka://localhost:{port}"},
            f"the broker's certificate at localhost:{port} is not for 'localhost'",
        ),
        "TLS without SASL to a SASL_SSL port": (
            {
                "PAIRSTREAM_KAFKA_SECURITY_PROTOCOL": "SSL",
                "PAIRSTREAM_TOPICS_READY_TIMEOUT_SECONDS": "3",
            },
            f"no broker answered within 3s: 127.0.0.1:{port}",
        ),
        "SASL without a username": (
            {"PAIRSTREAM_KAFKA_USERNAME": ""},
            "security protocol SASL_SSL needs PAIRSTREAM_KAFKA_USERNAME",
        ),
        "a SASL mechanism the broker does not enable": (
            {"PAIRSTREAM_KAFKA_SASL_MECHANISM": "SCRAM-SHA-256"},
            f"the broker at 127.0.0.1:{port} does not enable SASL mechanism SCRAM-SHA-256",
        ),
    }[fault]
    pipeline.worker_env.update(wrong)
    started = time.monotonic()
    code, log = await exits(pipeline)
    print(f"\n{fault}: exited {code} after {time.monotonic() - started:.1f} s")
    assert code == EX_CONFIG, log[-3000:]
    line = reason(log)
    assert expected in line
    # In the worker's log format, at CRITICAL, like every other line of its log.
    assert re.match(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\] \[\d+\] \[CRITICAL\] ", line), line
    if "mechanism" in fault:
        assert "PAIRSTREAM_KAFKA_SASL_MECHANISM" in line
    await nothing_written(pipeline)


def expected_words(permission: Permission, conf_prefix: str) -> str:
    if permission.resource is ResourceType.TOPIC:
        if permission.pattern is Pattern.PREFIXED:
            return f"{permission.operation.name} on topic '{conf_prefix}"
        return f"{permission.operation.name} on topic '{permission.name}'"
    if permission.resource is ResourceType.CLUSTER:
        return f"{permission.operation.name} on the cluster"
    return str(permission)


async def test_each_missing_acl_stops_the_worker_with_its_name(
    secure_broker: list[local_broker.Node], tmp_path: Path
) -> None:
    """A pipeline whose worker ran once with every ACL (so its internal topics exist);
    then, one at a time, each ACL is taken away and the worker started again. Its topics
    are named apart from the app id, or the internal topics' prefix would cover them."""
    tag = uuid.uuid4().hex[:8]
    topics = {
        f"PAIRSTREAM_{kind}_TOPIC": f"acl-{tag}.{kind.lower()}"
        for kind in ("EVENTS", "KEYED", "PAIRS", "UNPAIRED", "DEAD_LETTER")
    }
    pipeline = await secured_pipeline(secure_broker, tmp_path, **topics)
    first = pipeline.worker().start()
    await first.wait_ready()
    first.stop()
    ends = await nothing_written(pipeline)
    password = local_broker.security(secure_broker[0].name).password("worker")
    assert "Authenticated as worker" in first.log() and password not in first.log()
    admin = pipeline.conf.kafka
    permissions = worker_permissions(pipeline.conf)
    assert len(permissions) == 18  # what docs/deploy.md lists
    failures = []
    for permission in permissions:
        await revoke(admin, "User:worker", [permission])
        try:
            code, log = await exits(pipeline)
            words = expected_words(permission, f"{pipeline.conf.app_id}-")
            lines = [line for line in log.splitlines() if "cannot start:" in line]
            if code != EX_CONFIG or len(lines) != 1 or words not in lines[0]:
                failures.append(f"{permission}: exit {code}, {lines or log[-2000:]}")
        finally:
            await grant(admin, "User:worker", [permission])
    assert failures == []
    assert await nothing_written(pipeline) == ends  # the workers that could not start


def run_tool(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=EXIT_WITHIN_SECONDS * 4,  # Spark's imports on a busy machine
    )


async def test_spark_jobs_and_tools_that_cannot_connect_say_why(
    secure_broker: list[local_broker.Node], tmp_path: Path
) -> None:
    pipeline = await secured_pipeline(secure_broker, tmp_path)
    security = local_broker.security(secure_broker[0].name)
    bootstrap = local_broker.bootstrap_servers(secure_broker)
    analytics = {
        **pipeline.env_vars,
        **security.environment(bootstrap, "analytics"),
        "PAIRSTREAM_LAKE_DIR": str(tmp_path / "lake"),
    }
    # No ACLs granted to User:analytics for this pipeline's topics.
    denied = run_tool(analytics, "analytics", "ingest")
    assert denied.returncode == EX_CONFIG, denied.stderr[-3000:]
    assert f"lacks READ on topic '{pipeline.conf.events_topic}'" in denied.stderr
    wrong = {"PAIRSTREAM_KAFKA_PASSWORD_FILE": settings_file(tmp_path, "pw", "not-it\n")}
    refused = run_tool({**analytics, **wrong}, "analytics", "ingest")
    assert refused.returncode == EX_CONFIG, refused.stderr[-3000:]
    assert "refused user 'analytics'" in refused.stderr
    generator = {**pipeline.env_vars, **security.environment(bootstrap, "worker"), **wrong}
    produced = run_tool(generator, "tools.generate", "--count", "10")
    assert produced.returncode == EX_CONFIG, produced.stderr[-3000:]
    assert "refused user 'worker'" in produced.stderr
    assert not (tmp_path / "lake").exists()  # Spark never started
