"""Move a stopped pipeline's pairing to another number of keyed partitions, under a new
app id, with nothing pending lost and nothing emitted twice (docs/deploy.md, "More
keyed partitions").

    python -m tools.move_keyed --app-id NEW --partitions N --keyed-topic NEW_KEYED [--dry-run]

The old pipeline is the one the PAIRSTREAM_* settings describe; its workers must be
stopped, and its pairing stage must have read the keyed topic to its end (only
watermark records and ticks may be left). In one transaction it writes the new app id's
pairing-state changelog (every key re-partitioned over N, every partition's event clock
merged from the old ones) and source-progress changelog (copied), and commits the new
consumer group's offsets on the input topic at the old group's. It creates the new
keyed topic and changelogs first, and refuses to write into targets that hold anything.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import NewTopic
from aiokafka.errors import TopicAlreadyExistsError
from aiokafka.structs import OffsetAndMetadata

from app.exactly_once.handoff import FENCE_KEY
from app.kafka.admin import admin_client
from app.settings import Settings, settings
from pairing.keyed_move import MoveRefused, OldPartition, repartition
from pairing.records import CLOCK_KEY, HANDED, WATERMARK_KEY, decode_watermark, loads
from pairing.watermarks import WatermarkUpdate

log = logging.getLogger(__name__)

TICK_KEY = b"~tick"
PAIRING_TABLE = "pairing-state"
PROGRESS_TABLE = "source-progress"
EMPTY_GROUP_STATES = {"Empty", "Dead"}


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


async def _group_state(conf: Settings, group: str) -> str:
    async with admin_client(conf) as admin:
        [response] = await admin.describe_consumer_groups([group])
    error_code, _, state, *_ = response.groups[0]
    if error_code:
        raise MoveRefused(f"describing consumer group {group!r} failed: error code {error_code}")
    return str(state)


async def _committed(conf: Settings, group: str, tps: list[TopicPartition]) -> dict[int, int]:
    """The group's committed offsets of `tps` (one topic), by partition; -1: none."""
    async with admin_client(conf) as admin:
        found = await admin.list_consumer_group_offsets(group, partitions=tps)
    return {tp.partition: found[tp].offset if tp in found else -1 for tp in tps}


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


async def plan(conf: Settings, target: Target) -> Plan:
    """Read the old pipeline and check both sides; write nothing."""
    _check_settings(conf, target)
    old_n = conf.partitions
    for topic, want in [
        (conf.keyed_topic, old_n),
        (changelog(conf.app_id, PAIRING_TABLE), old_n),
        (conf.events_topic, conf.events_partitions),
    ]:
        found = await _partitions(conf, topic)
        if found != want:
            raise MoveRefused(
                f"topic {topic!r} has {found} partitions, the settings say {want}:"
                " run with the old pipeline's PAIRSTREAM_* settings"
            )
    state = await _group_state(conf, conf.app_id)
    if state not in EMPTY_GROUP_STATES:
        raise MoveRefused(
            f"consumer group {conf.app_id!r} is {state}: stop every worker of the old app first"
            " (a worker killed, or one with PAIRSTREAM_GROUP_INSTANCE_ID, stays a member until"
            " its session timeout, PAIRSTREAM_SESSION_TIMEOUT_SECONDS)"
        )
    result = Plan()
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
                " start the old workers again with the producers held back, wait until the"
                " consumer group has no lag on the keyed topic, stop them, and run again"
                " (docs/keyed-move.md)"
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
    progress_topic = changelog(conf.app_id, PROGRESS_TABLE)
    if await _partitions(conf, progress_topic) is not None:
        progress = await _read(
            conf,
            {TopicPartition(progress_topic, p): 0 for p in range(conf.events_partitions)},
        )
        result.progress = {tp.partition: _latest(records) for tp, records in progress.items()}
    inputs = [TopicPartition(conf.events_topic, p) for p in range(conf.events_partitions)]
    result.input_offsets = {
        p: offset
        for p, offset in (await _committed(conf, conf.app_id, inputs)).items()
        if offset >= 0
    }
    await _check_targets(conf, target)
    return result


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


async def _check_targets(conf: Settings, target: Target) -> None:
    """The new app id must have nothing yet: no group offsets, no committed changelog or
    keyed records (topics a failed run created, empty, are fine)."""
    state = await _group_state(conf, target.app_id)
    if state not in EMPTY_GROUP_STATES:
        raise MoveRefused(f"consumer group {target.app_id!r} is {state}: workers of it run")
    async with admin_client(conf) as admin:
        offsets = await admin.list_consumer_group_offsets(target.app_id)
    if offsets:
        raise MoveRefused(
            f"consumer group {target.app_id!r} has committed offsets already (a move done"
            " before, or workers started): choose a new app id"
        )
    for topic, want in [
        (target.keyed_topic, target.partitions),
        (changelog(target.app_id, PAIRING_TABLE), target.partitions),
        (changelog(target.app_id, PROGRESS_TABLE), conf.events_partitions),
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


async def _create_targets(conf: Settings, target: Target) -> None:
    compact = {"cleanup.policy": "compact"}
    wanted = [
        NewTopic(target.keyed_topic, target.partitions, conf.replication_factor),
        NewTopic(
            changelog(target.app_id, PAIRING_TABLE),
            target.partitions,
            conf.replication_factor,
            topic_configs=compact,
        ),
        NewTopic(
            changelog(target.app_id, PROGRESS_TABLE),
            conf.events_partitions,
            conf.replication_factor,
            topic_configs=compact,
        ),
    ]
    async with admin_client(conf) as admin:
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
    await _create_targets(conf, target)
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
    state = await _group_state(conf, conf.app_id)
    inputs = [TopicPartition(conf.events_topic, p) for p in range(conf.events_partitions)]
    now = {p: o for p, o in (await _committed(conf, conf.app_id, inputs)).items() if o >= 0}
    if state not in EMPTY_GROUP_STATES or now != result.input_offsets:
        raise MoveRefused(
            f"consumer group {conf.app_id!r} changed during the move (now {state}): nothing was"
            " written; stop every worker of the old app and run again"
        )


async def move(conf: Settings, target: Target, dry_run: bool = False) -> Plan:
    result = await plan(conf, target)
    if not dry_run:
        await write(conf, target, result)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.move_keyed", description=__doc__)
    parser.add_argument("--app-id", required=True, help="the new app id")
    parser.add_argument("--partitions", type=int, required=True, help="the new keyed partitions")
    parser.add_argument("--keyed-topic", required=True, help="the new keyed topic")
    parser.add_argument("--dry-run", action="store_true", help="check and report; write nothing")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    target = Target(args.app_id, args.partitions, args.keyed_topic)
    try:
        result = asyncio.run(move(settings(), target, args.dry_run))
    except MoveRefused as exc:
        print(f"refused: {exc}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps(result.summary()))
    if not args.dry_run:
        print(
            f"moved: start the workers with PAIRSTREAM_APP_ID={target.app_id}"
            f" PAIRSTREAM_PARTITIONS={target.partitions}"
            f" PAIRSTREAM_KEYED_TOPIC={target.keyed_topic} and an empty PAIRSTREAM_DATA_DIR"
        )


if __name__ == "__main__":
    main()
