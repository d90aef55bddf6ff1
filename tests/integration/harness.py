"""Real processes against the real broker: workers, the generator, the reader."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import IO, Any

import rocksdict
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from faust.stores.rocksdb import Store
from faust.types import TP
from pydantic import SecretStr

from app.kafka.access import worker_permissions
from app.kafka.admin import (
    admin_client,
    end_offsets,
    ensure_topics,
    read_committed,
    unread_committed,
)
from app.settings import Settings
from pairing.changes import parser_for
from tests.reference_model import Expected, Reading, expected_outputs
from tools import broker as local_broker
from tools import postgres
from tools.generate import Record, produce
from tools.kafka_acls import grant
from tools.ports import free_port
from tools.read_outputs import OutputReader, Outputs

ROOT = Path(__file__).resolve().parents[2]
FAUST = str(Path(sys.executable).with_name("faust"))
NEVER = "1000000"  # seconds: keeps wall-clock expiry and ticks out of exact comparisons


class Pipeline:
    """One isolated pipeline: its own app id, topics and data dirs."""

    def __init__(
        self,
        bootstrap: str,
        tmp: Path,
        worker_env: dict[str, str] | None = None,
        **overrides: str,
    ) -> None:
        """`overrides`: settings of the pipeline, for its workers and this process;
        `worker_env`: for its workers only (their Kafka user, say)."""
        name = f"it-{uuid.uuid4().hex[:10]}"
        # Every input record is produced after this: the model's clock guard reads it.
        self.created_ms = int(time.time() * 1000)
        self.tmp = tmp
        self.worker_env = worker_env or {}
        self.env_vars = {
            "PAIRSTREAM_APP_ID": name,
            "PAIRSTREAM_BROKER": f"kafka://{bootstrap}",
            "PAIRSTREAM_EVENTS_TOPIC": f"{name}-events",
            "PAIRSTREAM_KEYED_TOPIC": f"{name}-events-by-timestamp",
            "PAIRSTREAM_PAIRS_TOPIC": f"{name}-pairs",
            "PAIRSTREAM_UNPAIRED_TOPIC": f"{name}-unpaired",
            "PAIRSTREAM_DEAD_LETTER_TOPIC": f"{name}-events.dlq",
            "PAIRSTREAM_MATCH_TOPIC_PREFIX": f"{name}-matches.",
            "PAIRSTREAM_PARTITIONS": "4",
            "PAIRSTREAM_MAX_WAIT_SECONDS": NEVER,
            "PAIRSTREAM_TICK_INTERVAL_SECONDS": NEVER,
            # Written partitions never go idle: a producer that stalls for a moment
            # while event time runs hundreds of times faster than the wall clock (as
            # here) would otherwise let the watermark run ahead of its records
            # (docs/event-time.md). Nor do never-written ones: a test that has some
            # sets a timeout.
            "PAIRSTREAM_IDLE_TIMEOUT_SECONDS": NEVER,
            **overrides,
        }
        fields = {k.removeprefix("PAIRSTREAM_").lower(): v for k, v in self.env_vars.items()}
        self.conf = Settings(**fields)  # type: ignore[arg-type]

    async def create_topics(self) -> Pipeline:
        await ensure_topics(self.conf)
        return self

    def worker(self, index: int = 0) -> Worker:
        return Worker(self, index)

    async def produce(self, records: list[Record], rate: float = 0) -> None:
        await produce(records, self.conf.kafka, self.conf.events_topic, rate, False)

    def model(
        self, sources: list[list[bytes | None]], drained: bool = False, all_idle: bool = False
    ) -> Expected:
        return expected_outputs(
            sources,
            expiry_us=int(self.conf.expiry_seconds * 1_000_000),
            retention_us=int(self.conf.dedup_retention_seconds * 1_000_000),
            reading=Reading(
                self.conf.sizes,
                self.conf.max_ahead_us,
                self.created_ms,
                parser_for(self.conf.events_format),
            ),
            drained=drained,
            all_idle=all_idle,
        )

    async def expected(self, drained: bool = False) -> Expected:
        """The model over what the input topic holds now, partition by partition."""
        return self.model(await self.input_partitions(), drained)

    async def input_partitions(self) -> list[list[bytes | None]]:
        landed = await read_partitions(self.conf, self.conf.events_topic)
        return [[value for _, value in partition] for partition in landed]

    def planned(self, records: list[Record]) -> Expected:
        """Roughly what `records` will give, before they are produced (to plan faults by)."""
        return self.model([[value for _, value in records]])


def database_settings(cluster: postgres.Cluster) -> dict[str, object]:
    """The PAIRSTREAM_POSTGRES_* settings of a tools/postgres.py cluster, as its app role."""
    found = postgres.settings(cluster, postgres.APP)
    return {
        "postgres_host": found["host"],
        "postgres_port": int(found["port"]),
        "postgres_database": found["dbname"],
        "postgres_user": found["user"],
        "postgres_password": SecretStr(found["password"]),
    }


async def secured_pipeline(nodes: list[local_broker.Node], tmp: Path, **overrides: str) -> Pipeline:
    """A pipeline on the secured broker, set up by the super user; its workers connect
    as User:worker, with exactly the ACLs a worker needs (app/kafka/access.py)."""
    security = local_broker.security(nodes[0].name)
    bootstrap = local_broker.bootstrap_servers(nodes)
    admin = security.environment(bootstrap, "admin")
    pipeline = Pipeline(
        bootstrap, tmp, worker_env=security.environment(bootstrap, "worker"), **admin, **overrides
    )
    await pipeline.create_topics()
    await grant(pipeline.conf.kafka, "User:worker", worker_permissions(pipeline.conf))
    return pipeline


# A committed record with its offset (transaction markers take offsets too).
Logged = tuple[int, bytes | None, bytes | None]


async def read_logged(conf: Settings, topic: str) -> list[list[Logged]]:
    """A topic as it is, with read_committed: each partition's records in order."""
    async with read_committed(conf) as consumer:
        await consumer._client.force_metadata_update()
        numbers = sorted(consumer.partitions_for_topic(topic) or ())
        partitions = [TopicPartition(topic, p) for p in numbers]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await _end_offsets(consumer, partitions)
        records: list[list[Logged]] = []
        for tp in partitions:
            records.append([])
            while await consumer.position(tp) < ends[tp]:
                batch = await consumer.getmany(tp, timeout_ms=1000)
                records[-1].extend((m.offset, m.key, m.value) for m in batch.get(tp, []))
        return records


def without_offsets(logged: list[list[Logged]]) -> list[list[Record]]:
    return [[(key, value) for _, key, value in partition] for partition in logged]


async def read_partitions(conf: Settings, topic: str) -> list[list[Record]]:
    return without_offsets(await read_logged(conf, topic))


def state_up_to(records: list[Logged], last: int | None = None) -> dict[bytes, bytes]:
    """A changelog partition's records up to offset `last` (None: all), applied in order."""
    state: dict[bytes, bytes] = {}
    for offset, key, value in records:
        if last is not None and offset > last:
            break
        assert key is not None
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    return state


def read_local_partition(path: Path) -> tuple[dict[bytes, bytes], int | None]:
    """A table partition's RocksDB as a stopped or killed worker left it, and faust's
    persisted offset (the last changelog offset it holds)."""
    db = rocksdict.Rdict(
        str(path), rocksdict.Options(raw_mode=True), access_type=rocksdict.AccessType.read_only()
    )
    try:
        entries = dict(db.items())
    finally:
        db.close()
    persisted = entries.pop(Store.offset_key, None)
    return entries, None if persisted is None else int(persisted)


def local_state_off_the_changelog(
    workers: list[Worker], table_name: str, changelog: list[list[Logged]]
) -> list[str]:
    """Each worker's local partitions of a table (active or standby) that do not hold
    exactly the changelog up to the offset they say they have: a hole a restore or a
    standby left would surface only after a promotion, if ever."""
    found = []
    for worker in workers:
        for partition, records in enumerate(changelog):
            for path in worker.data_dir.glob(f"**/*{table_name}-{partition}.db"):
                local, persisted = read_local_partition(path)
                if persisted is None:
                    continue
                want = state_up_to(records, persisted)
                if local != want:
                    differ = sum(local.get(k) != v for k, v in want.items()) + len(
                        local.keys() - want.keys()
                    )
                    found.append(
                        f"{worker.data_dir.name} {table_name}[{partition}] at offset {persisted}:"
                        f" {differ} keys differ"
                    )
    return found


async def table(pipeline: Pipeline, name: str) -> dict[str, bytes]:
    """A table as its changelog holds it: the last value of each key."""
    rows: dict[str, bytes] = {}
    for partition in await read_logged(pipeline.conf, f"{pipeline.conf.app_id}-{name}-changelog"):
        rows.update((key.decode(), value) for key, value in state_up_to(partition).items())
    return rows


async def _end_offsets(
    consumer: AIOKafkaConsumer, partitions: list[TopicPartition], timeout: float = 120
) -> dict[TopicPartition, int]:
    """End offsets, waiting out a leader election (right after a broker restart)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            ends: dict[TopicPartition, int] = await consumer.end_offsets(partitions)
            return ends
        except KafkaError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)  # retry backoff while a new leader is elected
            await consumer._client.force_metadata_update()


STOP_GRACE_SECONDS = 30.0  # Kubernetes' default terminationGracePeriodSeconds


class Worker:
    """`faust -A app worker` in its own process."""

    def __init__(self, pipeline: Pipeline, index: int) -> None:
        self.pipeline = pipeline
        self.data_dir = pipeline.tmp / f"worker-{index}"
        self.log_path = pipeline.tmp / f"worker-{index}.log"
        self.web_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self._log_offset = 0
        self.wanted = False  # should be running: a supervisor restarts it if it exits
        self.unplanned_restarts = 0
        self.forced_stops = 0

    def start(self) -> Worker:
        self.wanted = True
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
            self.process = self._launch(log)
        return self

    def environment(self) -> dict[str, str]:
        """The worker's settings: the pipeline's, and its own data dir and port."""
        return {
            **self.pipeline.env_vars,
            **self.pipeline.worker_env,
            "PAIRSTREAM_DATA_DIR": str(self.data_dir),
            "PAIRSTREAM_WEB_PORT": str(self.web_port),
        }

    def command(self) -> list[str]:
        return [FAUST, "-A", "app", "worker", "-l", "info"]

    def _launch(self, log: IO[bytes]) -> subprocess.Popen[bytes]:
        """The process the worker's output comes from, and whose exit is the worker's."""
        return subprocess.Popen(
            self.command(),
            cwd=ROOT,
            env={**os.environ, **self.environment()},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def _send(self, sig: int) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, sig)

    def log(self) -> str:
        with self.log_path.open("rb") as log:
            log.seek(self._log_offset)
            return log.read().decode(errors="replace")

    def diagnosis(self, lines: int = 12) -> str:
        """Whether it runs, and the last warnings and errors it logged: what a test that
        timed out on its outputs shows of it (CI keeps only the test's failure)."""
        assert self.process is not None
        code = self.process.poll()
        state = "running" if code is None else f"exited with {code}"
        notable = [
            line[:300]
            for line in self.log().splitlines()
            if ("[WARNING]" in line or "[ERROR]" in line or "Traceback" in line)
            and "Missing sensor state" not in line  # faust's, at every rebalance
        ]
        return f"{self.log_path.name}: {state}\n" + "\n".join(notable[-lines:])

    async def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while "Worker]: Ready" not in self.log():
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"worker exited:\n{self.log()[-4000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"worker not ready after {timeout}s:\n{self.log()[-4000:]}")
            await asyncio.sleep(0.2)  # polling the log for the ready line

    def kill(self) -> None:
        """SIGKILL; stays wanted, so a fault that kills it must start it again."""
        self._signal(signal.SIGKILL)

    def stop(self, grace: float = STOP_GRACE_SECONDS) -> None:
        """SIGTERM, then SIGKILL after a grace period (see `stop_workers`)."""
        if not self._terminate():
            return
        assert self.process is not None
        try:
            self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self._force_stop()

    def _terminate(self) -> bool:
        """SIGTERM, if it runs; it is no longer wanted either way."""
        self.wanted = False
        assert self.process is not None
        if self.process.poll() is not None:
            return False
        self._send(signal.SIGTERM)
        return True

    def _force_stop(self) -> None:
        self.forced_stops += 1
        self.kill()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def restart_if_exited(self) -> int | None:
        """What a supervisor (Kubernetes, systemd) does for a worker that exits:
        start it again. Returns the exit code of a worker it restarted."""
        if not self.wanted or self.process is None:
            return None
        code = self.process.poll()
        if code is not None:
            self.unplanned_restarts += 1
            self.start()
        return code

    def _signal(self, sig: int) -> None:
        assert self.process is not None
        if self.process.poll() is None:
            self._send(sig)
        self.process.wait(timeout=120)


def live_members(group: int) -> list[int]:
    """Processes of a process group that still run (zombies left out: they write
    nothing, and their reaping is up to whoever is PID 1)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:  # exited while we looked
            continue
        if fields[0] != "Z" and int(fields[2]) == group:
            members.append(int(stat.parent.name))
    return members


def kill_group(process: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """SIGKILL a process started with `start_new_session` and everything it started,
    and wait until none of it runs: a job's children (Spark's JVM) outlive a kill of
    its Python process for a while, writing on."""
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=timeout)
    deadline = time.monotonic() + timeout
    while members := live_members(process.pid):
        assert time.monotonic() < deadline, f"still running after SIGKILL: {members}"
        time.sleep(0.05)  # polling /proc


async def stop_workers(workers: list[Worker], grace: float = STOP_GRACE_SECONDS) -> None:
    """SIGTERM all at once, then SIGKILL what still runs after the grace period, as
    Kubernetes does: faust can hang on exit when a stop meets a rebalance (counted in
    forced_stops). Stopping one after another would make each stop a rebalance for
    the next, and block the event loop meanwhile."""
    stopping = [worker for worker in workers if worker._terminate()]
    deadline = time.monotonic() + grace
    while any(w.running for w in stopping) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)  # polling the processes' exit
    for worker in stopping:
        if worker.running:
            worker._force_stop()


async def wait_for_outputs(reader: OutputReader, total: int, timeout: float) -> Outputs:
    """Read until at least `total` output records are committed, and no further: a
    fault waiting for this strikes at its point of progress, not when outputs pause."""
    deadline = time.monotonic() + timeout
    while reader.total < total and time.monotonic() < deadline:
        await reader.poll()
    return reader.outputs


async def finish(
    pipeline: Pipeline, workers: list[Worker], expected: Expected, timeout: float = 600
) -> Outputs:
    """Wait for every output the model predicts, stop the workers (nothing more can
    commit after that), and return all that was committed."""
    async with OutputReader(pipeline.conf) as reader:
        total = expected_total(expected)
        await wait_for_outputs(reader, total, timeout)
        assert reader.total >= total, (
            f"{reader.total} of {total} outputs after {timeout:.0f} s\n"
            + "\n".join(worker.diagnosis() for worker in workers)
        )
        uncommitted = await input_left_uncommitted(pipeline)
        assert not uncommitted, f"outputs committed without their inputs' offsets: {uncommitted}"
        await stop_workers(workers)
        return await reader.read_available()


async def input_left_uncommitted(pipeline: Pipeline, within: float = 15.0) -> dict[str, Any]:
    """Input partitions whose committed offset is still short of their end `within`
    seconds after every output came out. Each step's outputs commit with its offset,
    so none should be: one that is had its outputs committed without its offset, and
    the partition's next owner would process it again (docs/fault-matrix.md's defects:
    invalid inputs dead-lettered twice)."""
    conf = pipeline.conf
    async with admin_client(conf) as admin:
        [described] = await admin.describe_topics([conf.events_topic])  # as it is now
    tps = [TP(conf.events_topic, p) for p in range(len(described["partitions"]))]
    ends = await end_offsets(conf, tps)
    async with admin_client(conf) as admin:
        deadline = time.monotonic() + within
        while True:
            found = await admin.list_consumer_group_offsets(
                conf.app_id, partitions=[TopicPartition(tp.topic, tp.partition) for tp in tps]
            )
            # -1: never committed, which is right for a partition never written
            committed = {TP(tp.topic, tp.partition): max(0, m.offset) for tp, m in found.items()}
            short = {tp: committed.get(tp, 0) for tp in ends}
            short = {tp: offset for tp, offset in short.items() if offset < ends[tp]}
            # A transactional input (Connect's change topic) ends with a commit marker.
            unread = await unread_committed(conf, short, timeout=10) if short else set()
            behind = {str(tp): {"committed": short[tp], "end": ends[tp]} for tp in sorted(unread)}
            if not behind or time.monotonic() > deadline:
                return behind
            await asyncio.sleep(0.5)  # a commit interval


def compare(outputs: Outputs, expected: Expected) -> dict[str, Any]:
    """Differences between the outputs and the model; empty when they agree."""
    pairs = Counter((p["timestamp"], p["a_id"], p["b_id"], str(p["sum"])) for p in outputs.pairs)
    unpaired = Counter((u["timestamp"], u["type"], u["id"], u["reason"]) for u in outputs.unpaired)
    conflicts = Counter(d["id"] for d in outputs.dead_letters if d["reason"].startswith("conflict"))
    invalid = Counter(
        dead_lettered_bytes(d)
        for d in outputs.dead_letters
        if not d["reason"].startswith("conflict")
    )
    problems: dict[str, Any] = {}
    for name, got, want in [
        ("pairs", pairs, expected.pairs),
        ("unpaired", unpaired, expected.unpaired),
        ("conflicts", conflicts, expected.conflicts),
    ]:
        if got != want:
            problems[name] = {
                "extra": list((got - want).items())[:5],
                "missing": list((want - got).items())[:5],
                "got": sum(got.values()),
                "want": sum(want.values()),
            }
    if invalid != expected.invalid:
        problems["invalid"] = {"got": invalid.total(), "want": expected.invalid.total()}
    return problems


def dead_lettered_bytes(record: dict[str, Any]) -> bytes | None:
    """The input record a dead letter keeps."""
    if "value_base64" in record:
        return base64.b64decode(record["value_base64"])
    value = record["value"]
    return None if value is None else str(value).encode()


def expected_total(expected: Expected) -> int:
    return (
        expected.pairs.total()
        + expected.unpaired.total()
        + expected.conflicts.total()
        + expected.invalid.total()
    )
