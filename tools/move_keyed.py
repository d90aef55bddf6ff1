"""Move a stopped pipeline's pairing to another number of keyed partitions, under a new
app id, with nothing pending lost and nothing emitted twice (docs/deploy.md, "More
keyed partitions").

    python -m tools.move_keyed --check-drained
    python -m tools.move_keyed --app-id NEW --partitions N --keyed-topic NEW_KEYED [--dry-run]

The old pipeline is the one the PAIRSTREAM_* settings describe; its workers must be
stopped, and its pairing stage must have read the keyed topic to its end (only
watermark records and ticks may be left): `--check-drained` says whether it has
(exit 0) or not (exit 1), while the workers run. In one transaction it writes the new
app id's pairing-state changelog (every key re-partitioned over N, every partition's
event clock merged from the old ones) and source-progress changelog (copied), and
commits the new consumer group's offsets on the input topic at the old group's. It
creates the new keyed topic and changelogs first, and refuses to write into targets
that hold anything.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import (
    GroupCoordinatorNotAvailableError,
    GroupLoadInProgressError,
    NotCoordinatorForGroupError,
    TopicAlreadyExistsError,
    for_code,
)
from aiokafka.structs import OffsetAndMetadata
from faust.types import TP

from app.exactly_once.handoff import FENCE_KEY
from app.kafka.admin import admin_client, committed_records_between, described_partitions
from app.kafka.replication import replication_factor
from app.settings import Settings, settings
from pairing.keyed_move import MoveRefused, OldPartition, repartition
from pairing.records import CLOCK_KEY, HANDED, WATERMARK_KEY, decode_watermark, loads
from pairing.watermarks import WatermarkUpdate

log = logging.getLogger(__name__)

TICK_KEY = b"~tick"
PAIRING_TABLE = "pairing-state"
PROGRESS_TABLE = "source-progress"
EMPTY_GROUP_STATES = {"Empty", "Dead"}
# How long the group coordinator may stay unable to answer before the command gives up:
# a broker just started loads its partitions of __consumer_offsets first (about 2 s on
# the local broker, docs/faust-gaps.md, 22), and a failover moves them.
COORDINATOR_WAIT_SECONDS = 30.0
RETRY_BACKOFF_SECONDS = 0.5
# COORDINATOR_LOAD_IN_PROGRESS (14), COORDINATOR_NOT_AVAILABLE (15), NOT_COORDINATOR (16).
COORDINATOR_ERRORS = (
    GroupLoadInProgressError,
    GroupCoordinatorNotAvailableError,
    NotCoordinatorForGroupError,
)
COORDINATOR_ERROR_CODES = {error.errno for error in COORDINATOR_ERRORS}

T = TypeVar("T")


def changelog(app_id: str, table: str) -> str:
    """faust's changelog topic of a table: `{app id}-{table}-changelog`."""
    return f"{app_id}-{table}-changelog"


@dataclass(frozen=True)
class Target:
    app_id: str
    partitions: int
    keyed_topic: str


@dataclass
class Plan:
    """What the move reads and will write."""

    old_keys: int = 0
    pending_keys: int = 0
    unread_watermarks: int = 0
    unread_ticks: int = 0
    input_partitions: int = 0
    new_entries: dict[int, dict[bytes, bytes]] = field(default_factory=dict)
    progress: dict[int, dict[bytes, bytes]] = field(default_factory=dict)
    input_offsets: dict[int, int] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {
            "keys": self.old_keys,
            "keys_with_a_pending_event": self.pending_keys,
            "unread_watermark_records": self.unread_watermarks,
            "unread_ticks": self.unread_ticks,
            "keys_per_new_partition": {
                p: len(e) - (CLOCK_KEY in e) for p, e in sorted(self.new_entries.items())
            },
            "input_partitions": self.input_partitions,
            "input_offsets": dict(sorted(self.input_offsets.items())),
        }


class OpenTransactions(MoveRefused):
    """A partition to read has an open transaction: its end is not known until the
    transaction commits or the broker aborts it."""


def _consumer(conf: Settings, isolation: str) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        **conf.kafka.aiokafka(),
        isolation_level=isolation,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )


async def _ends(conf: Settings, tps: list[TopicPartition]) -> tuple[dict[Any, int], dict[Any, int]]:
    """Last stable offsets and high watermarks."""
    stable, high = _consumer(conf, "read_committed"), _consumer(conf, "read_uncommitted")
    await stable.start()
    await high.start()
    try:
        return await stable.end_offsets(tps), await high.end_offsets(tps)
    finally:
        await stable.stop()
        await high.stop()


async def _partitions(conf: Settings, topic: str) -> int | None:
    async with admin_client(conf) as admin:
        if topic not in set(await admin.list_topics()):
            return None
        [described] = await admin.describe_topics([topic])
    return len(described["partitions"])


async def _read(
    conf: Settings, starts: Mapping[TopicPartition, int]
) -> dict[TopicPartition, list[tuple[bytes | None, bytes | None]]]:
    """Committed records of each partition from its start to its last stable offset;
    refuses a partition with an open transaction (its end is not yet known)."""
    tps = list(starts)
    stable, high = await _ends(conf, tps)
    open_ = [f"{tp.topic}[{tp.partition}]" for tp in tps if stable[tp] < high[tp]]
    if open_:
        raise OpenTransactions(
            f"open transactions on {open_}: a worker was killed mid-transaction or still runs."
            " Wait for the broker to abort it (transaction.timeout.ms: 60 s for a worker, 5 min for"
            " this command) and run"
            " again"
        )
    found: dict[TopicPartition, list[tuple[bytes | None, bytes | None]]] = {tp: [] for tp in tps}
    reading = {tp for tp in tps if starts[tp] < stable[tp]}
    if not reading:
        return found
    consumer = _consumer(conf, "read_committed")
    await consumer.start()
    try:
        consumer.assign(list(reading))
        for tp in reading:
            consumer.seek(tp, starts[tp])
        while reading:
            batches = await consumer.getmany(*reading, timeout_ms=1000)
            for tp, records in batches.items():
                found[tp].extend((r.key, r.value) for r in records if r.offset < stable[tp])
            for tp in list(reading):
                if await consumer.position(tp) >= stable[tp]:
                    reading.discard(tp)
    finally:
        await consumer.stop()
    return found


def _latest(records: list[tuple[bytes | None, bytes | None]]) -> dict[bytes, bytes]:
    """A compacted changelog partition as a table: the last value of each key."""
    table: dict[bytes, bytes] = {}
    for key, value in records:
        if key is None:
            continue
        if value is None:
            table.pop(key, None)
        else:
            table[key] = value
    return table


class CoordinatorUnavailable(MoveRefused):
    """The group coordinator did not answer within COORDINATOR_WAIT_SECONDS."""


async def retrying(
    what: str,
    ask: Callable[[], Awaitable[T]],
    wait: float | None = None,
    backoff: float = RETRY_BACKOFF_SECONDS,
) -> T:
    """`ask()`, asked again while the group coordinator is loading, not known yet or
    moved (a broker just started or failed over), for `wait` seconds at most
    (COORDINATOR_WAIT_SECONDS; read at the call, so a test can shorten it)."""
    wait = COORDINATOR_WAIT_SECONDS if wait is None else wait
    deadline = time.monotonic() + wait
    while True:
        try:
            return await ask()
        except COORDINATOR_ERRORS as exc:
            if time.monotonic() >= deadline:
                raise CoordinatorUnavailable(
                    f"{what}: the group coordinator still answers {exc.message} after"
                    f" {wait:g} s (a broker starting or failing over): run again once the"
                    " broker is up"
                ) from exc
            await asyncio.sleep(backoff)


@dataclass(frozen=True)
class Member:
    member_id: str
    client_id: str
    host: str

    def __str__(self) -> str:
        return f"client id {self.client_id} on host {self.host} (member id {self.member_id})"


@dataclass(frozen=True)
class Group:
    state: str
    members: tuple[Member, ...] = ()

    @property
    def empty(self) -> bool:
        return self.state in EMPTY_GROUP_STATES

    def who(self) -> str:
        """Its members, for an operator to find the processes by (a worker still in the
        group after it was killed has no process: it leaves at its session timeout)."""
        if not self.members:
            return f"no member listed, the group is {self.state}"
        return "; ".join(str(member) for member in self.members)


def read_group(group_id: str, described: Sequence[Any]) -> Group:
    """One group of a DescribeGroups answer (versions 0 to 3, as aiokafka sends it:
    error code, group, state, protocol type, protocol, members as (member id, client
    id, client host, metadata, assignment)). A coordinator error is raised as aiokafka
    raises it, for `retrying`."""
    error_code, _, state, _, _, members, *_ = described
    if error_code in COORDINATOR_ERROR_CODES:
        raise for_code(error_code)(f"describing consumer group {group_id!r}")
    if error_code:
        raise MoveRefused(f"describing consumer group {group_id!r} failed: error code {error_code}")
    return Group(str(state), tuple(Member(str(m[0]), str(m[1]), str(m[2])) for m in members))


async def _describe(admin: AIOKafkaAdminClient, group_id: str) -> Group:
    [response] = await admin.describe_consumer_groups([group_id])
    return read_group(group_id, response.groups[0])


async def _group(conf: Settings, group_id: str) -> Group:
    async with admin_client(conf) as admin:
        return await retrying(
            f"describing consumer group {group_id!r}", lambda: _describe(admin, group_id)
        )


async def _group_offsets(
    conf: Settings, group_id: str, tps: list[TopicPartition] | None = None
) -> dict[TopicPartition, int]:
    """The group's committed offsets of `tps` (None: all). Asked once a describe of the
    group has succeeded: a coordinator still loading the group answers a look-up of
    offsets with one error for the request and no partitions, which aiokafka's admin
    reads as "nothing committed" (docs/faust-gaps.md, 22); a describe says it."""

    async def ask() -> dict[TopicPartition, int]:
        await _describe(admin, group_id)
        found = await admin.list_consumer_group_offsets(group_id, partitions=tps)
        return {tp: m.offset for tp, m in found.items() if m.offset >= 0}

    async with admin_client(conf) as admin:
        return await retrying(f"reading consumer group {group_id!r}'s offsets", ask)


async def _committed(conf: Settings, group: str, tps: list[TopicPartition]) -> dict[int, int]:
    """The group's committed offsets of `tps` (one topic), by partition; -1: none."""
    found = await _group_offsets(conf, group, tps)
    return {tp.partition: found.get(tp, -1) for tp in tps}


@dataclass
class Unread:
    """What a keyed partition holds past its pairing stage's committed offset."""

    committed: int
    events: int = 0
    ticks: int = 0
    watermarks: list[WatermarkUpdate] = field(default_factory=list)


async def unread_keyed(conf: Settings) -> dict[int, Unread]:
    """Each old keyed partition's records the old consumer group has not committed."""
    keyed = [TopicPartition(conf.keyed_topic, p) for p in range(conf.partitions)]
    committed = await _committed(conf, conf.app_id, keyed)
    records = await _read(conf, {tp: max(0, committed[tp.partition]) for tp in keyed})
    left: dict[int, Unread] = {}
    for tp, found in records.items():
        unread = left[tp.partition] = Unread(committed[tp.partition])
        for key, value in found:
            if key == FENCE_KEY or (key is not None and key.startswith(HANDED)):
                continue  # a trigger, or its effect is in the state (app/exactly_once/handoff.py)
            if key == WATERMARK_KEY and value is not None:
                unread.watermarks.append(decode_watermark(loads(value)))
            elif key == TICK_KEY:
                unread.ticks += 1
            else:
                unread.events += 1
    return left


def input_partitions(topic: str, found: int | None) -> int:
    """The input topic's partition count, as the broker has it: a worker takes it so
    (app/exactly_once/input_partitions.py), PAIRSTREAM_EVENTS_PARTITIONS sizing only an
    input that does not exist yet; and where none exists, no worker has run."""
    if found is None:
        raise MoveRefused(
            f"the input topic {topic!r} does not exist: run with the old pipeline's"
            " PAIRSTREAM_* settings"
        )
    return found


def progress_partitions(topic: str, found: int | None, inputs: int) -> int:
    """How many partitions of the source-progress changelog to copy. A worker sizes it
    like the input and grows it with it: one smaller missed the input's growth while
    the workers were stopped (its partitions beyond have no progress yet); one larger
    means the input was made again, and a worker refuses to start
    (`ChangelogLargerThanInput`)."""
    if found is not None and found > inputs:
        raise MoveRefused(
            f"changelog {topic!r} has {found} partitions, the input topic {inputs}: the input"
            " was made again with fewer partitions; its progress is stale"
        )
    return found or 0


@dataclass(frozen=True)
class OldTopics:
    inputs: int
    progress: int


async def _check_old_topics(conf: Settings) -> OldTopics:
    """The keyed topic and the pairing-state changelog with PAIRSTREAM_PARTITIONS
    partitions (a worker refuses to start otherwise), and the input topic as it is."""
    keyed = [conf.keyed_topic, changelog(conf.app_id, PAIRING_TABLE)]
    progress = changelog(conf.app_id, PROGRESS_TABLE)
    found = await described_partitions(conf, [*keyed, conf.events_topic, progress])
    for topic in keyed:
        if (have := found.get(topic)) != conf.partitions:
            raise MoveRefused(
                f"topic {topic!r} {'does not exist' if have is None else f'has {have} partitions'}"
                f", PAIRSTREAM_PARTITIONS says {conf.partitions}: run with the old pipeline's"
                " PAIRSTREAM_* settings"
            )
    inputs = input_partitions(conf.events_topic, found.get(conf.events_topic))
    return OldTopics(inputs, progress_partitions(progress, found.get(progress), inputs))


@dataclass
class Drain:
    """How far the old pipeline has drained (docs/keyed-move.md, step 1): the input
    ingest has not read, and what each keyed partition holds that pairing has not.
    Offsets do not tell: a caught-up partition written in transactions keeps its last
    commit marker past the committed offset (a lag of 1) for ever."""

    input_left: list[int] = field(default_factory=list)
    keyed: dict[int, Unread] = field(default_factory=dict)
    # Why the keyed partitions could not be read to their end yet, if they could not.
    open_transactions: str | None = None

    def reasons(self) -> list[str]:
        """What is left; none once drained. Unread watermark records and ticks do not
        count: the move takes them along."""
        left = (
            [f"ingest has not read input partitions {self.input_left}"] if self.input_left else []
        )
        if self.open_transactions:
            left.append(self.open_transactions)
        left += [
            f"pairing has not read {u.events} keyed events of partition {p}"
            for p, u in sorted(self.keyed.items())
            if u.events
        ]
        return left

    def summary(self) -> dict[str, Any]:
        return {
            "drained": not self.reasons(),
            "input_partitions_with_unread_records": self.input_left,
            "keyed": {
                p: {
                    "committed_offset": u.committed,
                    "unread_events": u.events,
                    "unread_watermark_records": len(u.watermarks),
                    "unread_ticks": u.ticks,
                }
                for p, u in sorted(self.keyed.items())
            },
            "open_transactions": self.open_transactions,
        }


async def _with_records(conf: Settings, starts: Mapping[TopicPartition, int]) -> list[int]:
    """The partitions with a committed record at or past their start offset, or with a
    transaction still open (its records may yet commit)."""
    stable, high = await _ends(conf, list(starts))
    found = []
    for tp, start in sorted(starts.items()):
        if stable[tp] < high[tp] or (
            start < stable[tp]
            and await committed_records_between(conf, TP(*tp), start, stable[tp] - 1)
        ):
            found.append(tp.partition)
    return found


async def check_drained(conf: Settings) -> Drain:
    """Read, with read_committed, each input and keyed partition from the old group's
    committed offset to its end; commit markers and aborted records are not read."""
    topics = await _check_old_topics(conf)
    tps = [TopicPartition(conf.events_topic, p) for p in range(topics.inputs)]
    committed = await _committed(conf, conf.app_id, tps)
    drain = Drain(await _with_records(conf, {tp: max(0, committed[tp.partition]) for tp in tps}))
    try:
        drain.keyed = await unread_keyed(conf)
    except OpenTransactions as exc:
        drain.open_transactions = str(exc)
    return drain


async def plan(conf: Settings, target: Target) -> Plan:
    """Read the old pipeline and check both sides; write nothing."""
    _check_settings(conf, target)
    old_n = conf.partitions
    topics = await _check_old_topics(conf)
    group = await _group(conf, conf.app_id)
    if not group.empty:
        raise MoveRefused(
            f"workers of the old app run: {group.who()}: stop every worker of consumer group"
            f" {conf.app_id!r} first (SIGTERM; a worker killed, or one with"
            " PAIRSTREAM_GROUP_INSTANCE_ID, stays a member until its session timeout,"
            " PAIRSTREAM_SESSION_TIMEOUT_SECONDS)"
        )
    result = Plan(input_partitions=topics.inputs)
    # The keyed topic: only watermark records and ticks may be left unread.
    left = await unread_keyed(conf)
    watermarks: dict[int, list[WatermarkUpdate]] = {}
    for partition, unread in sorted(left.items()):
        watermarks[partition] = unread.watermarks
        result.unread_watermarks += len(unread.watermarks)
        result.unread_ticks += unread.ticks
        if unread.events:
            raise MoveRefused(
                f"pairing has not read {unread.events} keyed events of"
                f" {conf.keyed_topic}[{partition}] (committed offset {unread.committed}):"
                " start the old workers again with the producers held back, wait until"
                " `python -m tools.move_keyed --check-drained` says drained, stop them, and"
                " run again (docs/keyed-move.md)"
            )
    # The pairing state, re-partitioned.
    tables = await _read(
        conf, {TopicPartition(changelog(conf.app_id, PAIRING_TABLE), p): 0 for p in range(old_n)}
    )
    old = {
        tp.partition: OldPartition(_latest(records), tuple(watermarks[tp.partition]))
        for tp, records in tables.items()
    }
    result.new_entries = repartition(old, target.partitions)
    for old_partition in old.values():
        for key, value in old_partition.entries.items():
            if key != CLOCK_KEY:
                result.old_keys += 1
                result.pending_keys += loads(value)["pending"] is not None
    # Source progress and the input offsets: copied as they are.
    if topics.progress:
        progress_topic = changelog(conf.app_id, PROGRESS_TABLE)
        progress = await _read(
            conf, {TopicPartition(progress_topic, p): 0 for p in range(topics.progress)}
        )
        result.progress = {tp.partition: _latest(records) for tp, records in progress.items()}
    result.input_offsets = await _input_offsets(conf, topics.inputs)
    await _check_targets(conf, target, topics.inputs)
    return result


async def _input_offsets(conf: Settings, inputs: int) -> dict[int, int]:
    """The old group's committed offsets of the input, by partition (none: left out)."""
    tps = [TopicPartition(conf.events_topic, p) for p in range(inputs)]
    return {p: o for p, o in (await _committed(conf, conf.app_id, tps)).items() if o >= 0}


def _check_settings(conf: Settings, target: Target) -> None:
    enabled = [
        name
        for name, on in [
            ("PAIRSTREAM_DELIVERY_ENABLED", conf.delivery_enabled),
            ("PAIRSTREAM_CHAIN_ENABLED", conf.chain_enabled),
            ("PAIRSTREAM_ENRICHMENT_ENABLED", conf.enrichment_enabled),
        ]
        if on
    ]
    if enabled:
        raise MoveRefused(
            f"{', '.join(enabled)}: their state and offsets are not moved; this command moves"
            " the pairing only"
        )
    if target.app_id == conf.app_id:
        raise MoveRefused("the new app id must differ from the old one")
    if target.keyed_topic == conf.keyed_topic:
        raise MoveRefused("the new keyed topic must differ from the old one")
    if target.partitions < 1:
        raise MoveRefused("the new partition count must be at least 1")


async def _check_targets(conf: Settings, target: Target, inputs: int) -> None:
    """The new app id must have nothing yet: no group offsets, no committed changelog or
    keyed records (topics a failed run created, empty, are fine)."""
    group = await _group(conf, target.app_id)
    if not group.empty:
        raise MoveRefused(f"workers of the new app id {target.app_id!r} run: {group.who()}")
    if await _group_offsets(conf, target.app_id):
        raise MoveRefused(
            f"consumer group {target.app_id!r} has committed offsets already (a move done"
            " before, or workers started): choose a new app id"
        )
    for topic, want in [
        (target.keyed_topic, target.partitions),
        (changelog(target.app_id, PAIRING_TABLE), target.partitions),
        (changelog(target.app_id, PROGRESS_TABLE), inputs),
    ]:
        found = await _partitions(conf, topic)
        if found is None:
            continue
        if found != want:
            raise MoveRefused(f"topic {topic!r} exists with {found} partitions, not {want}")
        tps = [TopicPartition(topic, p) for p in range(found)]
        stable, _ = await _ends(conf, tps)
        records = await _read(conf, {tp: 0 for tp in tps if stable[tp] > 0})
        if any(records.values()):
            raise MoveRefused(f"topic {topic!r} holds committed records: choose a new app id")


async def _create_targets(conf: Settings, target: Target, inputs: int) -> None:
    compact = {"cleanup.policy": "compact"}
    async with admin_client(conf) as admin:
        replicas = await replication_factor(conf, admin)  # as a worker creates its topics
        wanted = [
            NewTopic(target.keyed_topic, target.partitions, replicas),
            NewTopic(
                changelog(target.app_id, PAIRING_TABLE),
                target.partitions,
                replicas,
                topic_configs=compact,
            ),
            NewTopic(
                changelog(target.app_id, PROGRESS_TABLE), inputs, replicas, topic_configs=compact
            ),
        ]
        existing = set(await admin.list_topics())
        for topic in wanted:
            if topic.name not in existing:
                with suppress(TopicAlreadyExistsError):  # a run that failed made it
                    await admin.create_topics([topic])
    for topic in wanted:
        while await _partitions(conf, topic.name) != topic.num_partitions:
            await asyncio.sleep(0.2)  # polling the broker's metadata for the new topic


async def write(conf: Settings, target: Target, result: Plan) -> None:
    """Everything the new app id starts from, in one transaction."""
    await _create_targets(conf, target, result.input_partitions)
    producer = AIOKafkaProducer(
        **conf.kafka.aiokafka(),
        transactional_id=f"{target.app_id}-keyed-move",
        enable_idempotence=True,
        transaction_timeout_ms=300_000,
    )
    await producer.start()
    try:
        async with producer.transaction():
            pairing = changelog(target.app_id, PAIRING_TABLE)
            for partition, entries in sorted(result.new_entries.items()):
                for key, value in entries.items():
                    await producer.send(pairing, value, key, partition)
            progress = changelog(target.app_id, PROGRESS_TABLE)
            for partition, entries in sorted(result.progress.items()):
                for key, value in entries.items():
                    await producer.send(progress, value, key, partition)
            if result.input_offsets:
                offsets = {
                    TopicPartition(conf.events_topic, p): OffsetAndMetadata(offset, "")
                    for p, offset in result.input_offsets.items()
                }
                await producer.send_offsets_to_transaction(offsets, target.app_id)
            # A worker of the old app id started meanwhile: abort (leaving the block by
            # an exception aborts the transaction).
            await _unchanged(conf, result)
    finally:
        await producer.stop()


async def _unchanged(conf: Settings, result: Plan) -> None:
    group = await _group(conf, conf.app_id)
    now = await _input_offsets(conf, result.input_partitions)
    if not group.empty or now != result.input_offsets:
        raise MoveRefused(
            f"consumer group {conf.app_id!r} changed during the move (now {group.state}:"
            f" {group.who()}): nothing was written; stop every worker of the old app and run"
            " again"
        )


async def move(conf: Settings, target: Target, dry_run: bool = False) -> Plan:
    result = await plan(conf, target)
    if not dry_run:
        await write(conf, target, result)
    return result


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tools.move_keyed", description=__doc__)
    parser.add_argument("--app-id", help="the new app id")
    parser.add_argument("--partitions", type=int, help="the new keyed partitions")
    parser.add_argument("--keyed-topic", help="the new keyed topic")
    parser.add_argument("--dry-run", action="store_true", help="check and report; write nothing")
    parser.add_argument(
        "--check-drained",
        action="store_true",
        help="whether the old pipeline has drained (step 1): exit 0 if so, 1 if not",
    )
    args = parser.parse_args(argv)
    target = [args.app_id, args.partitions, args.keyed_topic]
    if args.check_drained and (args.dry_run or any(a is not None for a in target)):
        parser.error("--check-drained takes no other option")
    if not args.check_drained and any(a is None for a in target):
        parser.error("--app-id, --partitions and --keyed-topic are required")
    return args


def _report_drain(conf: Settings) -> int:
    drain = asyncio.run(check_drained(conf))
    print(json.dumps(drain.summary()))
    if reasons := drain.reasons():
        print(f"not drained: {'; '.join(reasons)}")
        return 1
    print("drained: stop every worker now (SIGTERM), then move")
    return 0


def _report_move(conf: Settings, target: Target, dry_run: bool) -> int:
    result = asyncio.run(move(conf, target, dry_run))
    print(json.dumps(result.summary()))
    if not dry_run:
        print(
            f"moved: start the workers with PAIRSTREAM_APP_ID={target.app_id}"
            f" PAIRSTREAM_PARTITIONS={target.partitions}"
            f" PAIRSTREAM_KEYED_TOPIC={target.keyed_topic} and an empty PAIRSTREAM_DATA_DIR"
        )
    return 0


def main(argv: list[str] | None = None) -> None:
    args = _arguments(argv)
    logging.basicConfig(level=logging.WARNING)
    try:
        if args.check_drained:
            code = _report_drain(settings())
        else:
            target = Target(args.app_id, args.partitions, args.keyed_topic)
            code = _report_move(settings(), target, args.dry_run)
    except MoveRefused as exc:
        print(f"refused: {exc}", file=sys.stderr)
        code = 2
    sys.exit(code)


if __name__ == "__main__":
    main()
