"""No input can stop a partition: a worker with every service enabled is sent
a poison corpus on every input topic (non-JSON, empty, huge exponents, 400-digit
numbers, NaN and Infinity, Unicode digits, impossible dates, wrong types, deep nesting,
very long strings) among valid records. Every partition keeps flowing: the valid records
after the poison come out, and the group's committed offsets reach the end of every
input partition, with no restart; every poison record is dead-lettered exactly once
(rejected by a parser, or by the processing-error boundary where handling it raises).

Each poison record is invalid whatever the grammar: one whose odd part a parser might
accept has another defect too (an unknown account, a key that is no day, a value that
is no object), so the test holds with or without stricter parsers.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from faust.types import TP

from app.kafka.admin import admin_client, end_offsets, read_committed
from tests.integration.harness import Pipeline, Worker, dead_lettered_bytes, read_partitions, table
from tools.generate import Record, produce
from tools.order_api import OrderApi

pytestmark = pytest.mark.broker

DEEP = b'{"a":' * 5000 + b"1" + b"}" * 5000
LONG = "x" * 300_000
NINES = "9" * 400
DAY, LATER = "2024-03-07", "2024-03-08"  # the waiting pairs' day; the events' day
ROW, LATER_ROW = b'{"tariff": "peak"}', b'{"tariff": "later"}'
WAITING = 40  # pairs of DAY waiting for its row: some in every partition


def deposit(account: str, deposit_id: str, amount: str) -> bytes:
    return f'{{"account":"{account}","deposit_id":"{deposit_id}","amount":{amount}}}'.encode()


POISON_EVENTS: list[bytes] = [
    b"not json \xff\xfe",
    b"",
    b'{"type":"A","timestamp":"2024-03-08 00:00:00","value":1e999999999}',
    f'{{"type":"A","timestamp":"2024-03-08 00:00:01","value":{NINES}}}'.encode(),
    b'{"type":"A","timestamp":"2024-03-08 00:00:02","value":NaN}',
    b'{"type":"B","timestamp":"2024-03-08 00:00:03","value":"-Infinity"}',
    '{"type":"A","timestamp":"٢٠٢٤-03-08 00:00:04","value":"١٢٣"}'.encode(),
    b'{"type":"A","timestamp":"2024-02-30 00:00:05","value":1}',
    b'{"type":5,"timestamp":["2024"],"value":{}}',
    b"[1, 2, 3]",
    DEEP,
    f'{{"type":"{LONG}","timestamp":"2024-03-08 00:00:06","value":1}}'.encode(),
]
POISON_DEPOSITS: list[bytes] = [
    b"not json \xff\xfe",
    b"",
    deposit("acct-poison", "p-exp", "1e999999999"),  # the balance overflows
    deposit("acct-unknown", "p-400", NINES),
    deposit("acct-poison", "p-nan", "NaN"),
    deposit("acct-poison", "p-inf", '"Infinity"'),
    deposit("acct-unknown", "p-uni", '"١٢٣"'),
    deposit("acct-unknown", "p-date", '"2024-02-30"'),
    b'{"account":7,"deposit_id":null,"amount":true}',
    b"[1, 2, 3]",
    DEEP,
    deposit("acct-poison", "p-long", f'"{LONG}"'),
]
POISON_ACCOUNTS: list[bytes] = [
    b"not json \xff\xfe",
    b"",
    *(
        f'{{"account":"acct-odd","status":{status}}}'.encode()
        for status in ("1e999999999", NINES, "NaN", '"Infinity"', '"١٢٣"', '"2024-02-30"')
    ),
    b'{"account":7,"status":1}',
    b"[1, 2, 3]",
    DEEP,
    f'{{"account":"acct-odd","status":"{LONG}"}}'.encode(),
]
# (key, value): rows the broadcast rejects, then two it passes whose JSON breaks the
# join of the pairs waiting for them (rejected by a stricter parser instead).
POISON_ROWS: list[tuple[bytes, bytes]] = [
    (DAY.encode(), b"not json \xff\xfe"),
    (DAY.encode(), b""),
    (DAY.encode(), b"1e999999999"),
    (DAY.encode(), NINES.encode()),
    (DAY.encode(), b"NaN"),
    ("٢٠٢٤-03-07".encode(), b'{"tariff": "unicode key"}'),
    (b"2024-02-30", b"[]"),
    (b"7", b'{"tariff": "wrong key"}'),
    (DAY.encode(), LONG.encode()),
]
JOIN_BREAKING: list[bytes] = [b"{not json}", DEEP]
POISON_ORDERS: list[bytes] = [
    b"not json \xff\xfe",
    b"",
    b"1e999999999",
    NINES.encode(),
    b"NaN",
    "١٢٣".encode(),
    b'"2024-02-30"',
    b"true",
    b"[1, 2, 3]",
    DEEP,
    f'"{LONG}"'.encode(),
]


@pytest.fixture
async def api() -> AsyncIterator[OrderApi]:
    server = await OrderApi(seed=47).start()
    yield server
    await server.stop()


# Every event of the patterns' input is a match of its own, decided once every input
# partition's progress is past it (lateness 0).
EACH_EVENT = """
[input]
topics = ["{topic}"]

[[pattern]]
name = "each"
key = "value"
within = 1

[[pattern.step]]
name = "one"
"""


def everything(broker: str, tmp: Path, api: OrderApi) -> Pipeline:
    name = Pipeline(broker, tmp).conf.app_id
    patterns = tmp / "patterns.toml"
    patterns.write_text(EACH_EVENT.format(topic=f"{name}-pattern-input"))
    return Pipeline(
        broker,
        tmp,
        PAIRSTREAM_APP_ID=name,
        PAIRSTREAM_PATTERNS_FILE=str(patterns),
        PAIRSTREAM_PATTERN_LATENESS_SECONDS="0",
        PAIRSTREAM_MATCH_TOPIC_PREFIX=f"{name}-matches.",
        PAIRSTREAM_CHAIN_ENABLED="true",
        PAIRSTREAM_DEPOSITS_TOPIC=f"{name}-deposits",
        PAIRSTREAM_ACCOUNTS_TOPIC=f"{name}-accounts",
        PAIRSTREAM_VALIDATED_TOPIC=f"{name}-deposits.validated",
        PAIRSTREAM_DEPOSITS_DEAD_LETTER_TOPIC=f"{name}-deposits.dlq",
        PAIRSTREAM_ENRICHMENT_ENABLED="true",
        PAIRSTREAM_SOURCES_TOPIC=f"{name}-sources",
        PAIRSTREAM_ENRICHED_TOPIC=f"{name}-pairs.enriched",
        PAIRSTREAM_SOURCES_DEAD_LETTER_TOPIC=f"{name}-sources.dlq",
        PAIRSTREAM_ENRICHMENT_BOUND_SECONDS=str(30 * 86400),  # no pair stops waiting
        PAIRSTREAM_DELIVERY_ENABLED="true",
        PAIRSTREAM_DELIVERY_TOPIC=f"{name}-orders",
        PAIRSTREAM_DELIVERY_URL=f"{api.url}/orders",
        PAIRSTREAM_DELIVERY_DEAD_LETTER_TOPIC=f"{name}-deliveries.dlq",
        PAIRSTREAM_DELIVERY_UNCERTAIN_TOPIC=f"{name}-deliveries.uncertain",
    )


async def values(pipeline: Pipeline, topic: str) -> list[bytes]:
    return [v for p in await read_partitions(pipeline.conf, topic) for _, v in p if v]


async def until(worker: Worker, what: str, check: Any, timeout: float = 240) -> None:
    """Poll the committed outputs until `check()` holds; the worker must not exit."""
    deadline = time.monotonic() + timeout
    while not await check():
        assert worker.running, f"the worker exited:\n{worker.log()[-4000:]}"
        assert time.monotonic() < deadline, f"not {what} after {timeout}s:\n{worker.log()[-4000:]}"
        await asyncio.sleep(1)  # polling committed outputs


def events_of(day: str, count: int) -> list[Record]:
    return [
        (None, f'{{"type":"{kind}","timestamp":"{day} 10:00:{n:02d}","value":{n}}}'.encode())
        for n in range(count)
        for kind in ("A", "B")
    ]


def pattern_inputs(conf: Any) -> list[str]:
    assert conf.patterns is not None and conf.patterns.input is not None
    return list(conf.patterns.input.topics)


async def lag(pipeline: Pipeline) -> dict[str, int]:
    """Input partitions whose committed offset is short of their end, by how much."""
    conf = pipeline.conf
    topics = [conf.deposits_topic, conf.accounts_topic, conf.sources_topic, conf.delivery_source]
    topics += pattern_inputs(conf)
    tps = [TP(conf.events_topic, p) for p in range(conf.events_partitions)]
    tps += [TP(topic, p) for topic in topics for p in range(conf.partitions)]
    ends = await end_offsets(conf, tps)
    async with admin_client(conf) as admin:
        found = await admin.list_consumer_group_offsets(
            conf.app_id, partitions=[TopicPartition(tp.topic, tp.partition) for tp in tps]
        )
    committed = {TP(tp.topic, tp.partition): max(0, m.offset) for tp, m in found.items()}
    return {
        str(tp): end - committed.get(tp, 0)
        for tp, end in ends.items()
        if committed.get(tp, 0) < end
    }


async def test_poison_on_every_input_is_dead_lettered_once_and_stops_no_partition(
    broker: str, tmp_path: Path, api: OrderApi
) -> None:
    pipeline = await everything(broker, tmp_path, api).create_topics()
    conf = pipeline.conf
    kafka = conf.kafka
    worker = pipeline.worker().start()
    try:
        await worker.wait_ready()
        # Pairs of DAY wait for its row in every partition; the accounts exist.
        pairs = [
            (f"{DAY}T10:00:{n:02d}Z".encode(), json.dumps({"n": n}).encode())
            for n in range(WAITING)
        ]
        await produce(pairs, kafka, conf.pairs_topic, 0, False)
        opened = [
            (a.encode(), f'{{"account":"{a}","status":"open"}}'.encode())
            for a in ("acct-poison", "acct-ok")
        ]
        await produce(opened, kafka, conf.accounts_topic, 0, False)
        await produce([(LATER.encode(), LATER_ROW)], kafka, conf.sources_topic, 0, False)

        async def ready() -> bool:
            enrichment = await table(pipeline, "enrichment")
            waiting = {key.split(":")[1] for key in enrichment if key.startswith("w:")}
            accounts = await table(pipeline, "accounts")
            return (
                len(waiting) == conf.partitions
                and "a:acct-poison" in accounts
                and "a:acct-ok" in accounts
            )

        await until(worker, "waiting in every partition", ready)

        # The poison, and valid records after it on every input.
        await produce([(None, v) for v in POISON_EVENTS], kafka, conf.events_topic, 0, False)
        await produce(events_of(LATER, 30), kafka, conf.events_topic, 0, False)
        await produce([(b"k", v) for v in POISON_DEPOSITS], kafka, conf.deposits_topic, 0, False)
        valid_deposits = [(None, deposit("acct-ok", f"ok-{n}", "1.5")) for n in range(20)]
        await produce(valid_deposits, kafka, conf.deposits_topic, 0, False)
        await produce([(b"k", v) for v in POISON_ACCOUNTS], kafka, conf.accounts_topic, 0, False)
        rows = [*POISON_ROWS, *((DAY.encode(), v) for v in JOIN_BREAKING), (DAY.encode(), ROW)]
        await produce(rows, kafka, conf.sources_topic, 0, False)
        await produce([(None, v) for v in POISON_ORDERS], kafka, conf.delivery_source, 0, False)
        orders = [(None, json.dumps({"id": f"order-{n}", "amount": n}).encode()) for n in range(20)]
        await produce(orders, kafka, conf.delivery_source, 0, False)

        async def flowed() -> bool:
            enriched = [json.loads(v) for v in await values(pipeline, conf.enriched_topic)]
            references = Counter(json.dumps(e["reference"]) for e in enriched if e["enriched"])
            validated = await values(pipeline, conf.validated_topic)
            return (
                references[json.dumps(json.loads(ROW))] == WAITING
                and references[json.dumps(json.loads(LATER_ROW))] == 30
                and len(validated) == len(valid_deposits)
                and all(api.applied[body.decode()] == 1 for _, body in orders)
            )

        await until(worker, "past the poison on every input", flowed)
        deadline = time.monotonic() + 60
        while behind := await lag(pipeline):
            assert time.monotonic() < deadline, f"input partitions not committed: {behind}"
            await asyncio.sleep(0.5)  # a commit interval
        async with aiohttp.ClientSession() as session:
            base = f"http://127.0.0.1:{worker.web_port}"
            async with session.get(f"{base}/stats") as response:
                stats = await response.json()
            async with session.get(f"{base}/metrics") as response:
                metrics = await response.text()
    finally:
        worker.stop()
    assert worker.unplanned_restarts == 0

    dead: dict[str, list[dict[str, Any]]] = {}
    for topic in (
        conf.dead_letter_topic,
        conf.deposits_dead_letter_topic,
        conf.sources_dead_letter_topic,
        conf.delivery_dead_letter_topic,
    ):
        dead[topic] = [json.loads(v) for v in await values(pipeline, topic)]
    positions = Counter(
        (d["source_topic"], d["source_partition"], d["source_offset"])
        for letters in dead.values()
        for d in letters
    )
    assert [p for p, n in positions.items() if n > 1] == []

    def once(topic: str, poison: list[bytes]) -> None:
        kept = Counter(dead_lettered_bytes(d) for d in dead[topic])
        sent = Counter(poison)  # some are sent to both of a service's inputs
        assert {p[:60]: kept[p] for p in sent} == {p[:60]: n for p, n in sent.items()}, topic

    once(conf.dead_letter_topic, POISON_EVENTS)
    once(conf.deposits_dead_letter_topic, [*POISON_DEPOSITS, *POISON_ACCOUNTS])
    once(conf.sources_dead_letter_topic, [value for _, value in POISON_ROWS])
    once(conf.delivery_dead_letter_topic, POISON_ORDERS)
    # A row the broadcast passes is copied to every partition: each copy at most once.
    row_letters = Counter(dead_lettered_bytes(d) for d in dead[conf.sources_dead_letter_topic])
    assert all(1 <= row_letters[row] <= conf.partitions for row in JOIN_BREAKING)
    # What the boundary dead-lettered is what the worker counted.
    boundary = sum(
        d["reason"].startswith("processing error:") for letters in dead.values() for d in letters
    )
    assert stats["totals"]["processing_errors"] == boundary
    assert "pairstream_processing_errors" in metrics or boundary == 0


# --- records at the edges of size and clock ------------------------------------------

BIG = 2_000_000  # a value past every limit: the topics here take it, as a user's may
LONG_KEY = b"k" * 1_000_000
INVALID_900K = b'"' * 900_000  # escaped, twice that: a dead letter must cut it
EDGE_PARTITION = 1
STALL_SECONDS = 20.0  # a freeze detector, not a speed target: one took 13-81 s before

Poison = tuple[str, str, bytes | None, bytes]  # topic, reason, key, value
Follower = tuple[str, list[tuple[bytes | None, bytes]], bytes]  # topic, records, marker


def padded(record: str) -> bytes:
    """A record of the right shape, padded with a field to BIG bytes."""
    head = record[:-1] + ',"pad":"'
    return (head + "x" * (BIG - len(head) - 2) + '"}').encode()


def edge_cases(topic: str, valid: str, key: bytes | None, prefix: str = "") -> list[Poison]:
    """A 2 MB value, a 1 MB key, an invalid 900 KB value: each with its reason."""
    return [
        (topic, f"{prefix}oversize record: {BIG} bytes > 65536", key, padded(valid)),
        (topic, f"{prefix}oversize key: {len(LONG_KEY)} bytes > 1024", LONG_KEY, valid.encode()),
        (topic, f"{prefix}oversize record: {len(INVALID_900K)} bytes > 65536", key, INVALID_900K),
    ]


def edge_inputs(conf: Any) -> list[tuple[Poison, Follower]]:
    """Each poison, and the valid record sent after it on the same partition, with the
    marker its output carries."""
    event = '{"type":"A","timestamp":"2024-03-09 11:00:00","value":1}'
    far_future = event.replace("2024-03-09", "9999-12-31").encode()
    events = [
        *edge_cases(conf.events_topic, event, b"e"),
        (conf.events_topic, "timestamp too far in the future", None, far_future),
    ]
    deposits = edge_cases(
        conf.deposits_topic, deposit("acct-ok", "big", "1.00").decode(), b"acct-ok", "invalid: "
    )
    accounts = edge_cases(
        conf.accounts_topic, '{"account":"acct-big","status":"open"}', b"acct-big", "invalid: "
    )
    rows = edge_cases(conf.sources_topic, '{"tariff":"big"}', b"2024-05-01", "invalid: ")
    orders = edge_cases(conf.delivery_source, '{"id":"big","amount":1}', None, "invalid: ")
    [pattern_input] = pattern_inputs(conf)
    pattern_event = '{"timestamp":"2024-03-09 11:00:00","value":1,"id":"big"}'
    pattern_events = [
        *edge_cases(pattern_input, pattern_event, b"p"),
        (pattern_input, "timestamp too far in the future", None, far_future),
    ]
    cases: list[tuple[Poison, Follower]] = []
    for n, poison in enumerate(events):
        pair = [
            (None, f'{{"type":"{t}","timestamp":"2024-03-10 10:00:0{n}","value":{n}}}'.encode())
            for t in "AB"
        ]
        marker = f'2024-03-10T10:00:0{n}Z|{{"timestamp"'.encode()  # a pair's key and value
        cases.append((poison, (poison[0], pair, marker)))
    for n, poison in enumerate(deposits):
        valid = [(b"acct-ok", deposit("acct-ok", f"deposit-after-{n}", "1.5"))]
        cases.append((poison, (poison[0], valid, f'"deposit-after-{n}"'.encode())))
    for n, poison in enumerate(accounts):
        name = f"acct-after-{n}"
        opened = [(name.encode(), f'{{"account":"{name}","status":"open"}}'.encode())]
        cases.append((poison, (poison[0], opened, f"a:{name}|".encode())))
    for n, poison in enumerate(rows):
        day = f"2024-04-0{n + 1}"
        cases.append(
            (poison, (poison[0], [(day.encode(), b'{"tariff": "after"}')], f"r:0:{day}|".encode()))
        )
    for n, poison in enumerate(orders):
        order = [(None, f'{{"id":"order-after-{n}","amount":{n}}}'.encode())]
        cases.append((poison, (poison[0], order, f'"order-after-{n}"'.encode())))
    for n, poison in enumerate(pattern_events):
        after = f'{{"timestamp":"2024-06-0{n + 1} 10:00:00","value":{n},"id":"pattern-after-{n}"}}'
        cases.append(
            (poison, (poison[0], [(None, after.encode())], f'"pattern-after-{n}"'.encode()))
        )
    return cases


def moving_on(follower: bytes, partitions: int) -> list[tuple[int, bytes]]:
    """After a pattern input's follower, an event a minute later on every partition of
    the input, matched by no pattern (no key field): every partition's progress is
    then past the follower, so its match is decided; the next follower is a day on."""
    time = json.loads(follower)["timestamp"].replace("10:00:00", "10:01:00")
    return [
        (p, json.dumps({"timestamp": time, "id": f"moving-{time}-{p}"}).encode())
        for p in range(partitions)
    ]


class Watch:
    """Committed outputs as they appear: when each marker was first seen, and how often."""

    def __init__(
        self, pipeline: Pipeline, topics: list[str], markers: list[bytes], api: OrderApi
    ) -> None:
        self.pipeline, self.topics, self.markers, self.api = pipeline, topics, markers, api
        self.orders: dict[bytes, str] = {}  # marker -> body: out once the API applied it
        self.seen: dict[bytes, float] = {}
        self.count: Counter[bytes] = Counter()

    async def run(self) -> None:
        async with read_committed(self.pipeline.conf) as consumer:
            await consumer._client.force_metadata_update()
            partitions = [
                TopicPartition(topic, p)
                for topic in self.topics
                for p in sorted(consumer.partitions_for_topic(topic) or ())
            ]
            consumer.assign(partitions)
            await consumer.seek_to_beginning(*partitions)
            while True:
                batches = await consumer.getmany(timeout_ms=100)
                now = time.monotonic()
                for marker, body in self.orders.items():
                    if self.api.applied[body] and marker not in self.seen:
                        self.seen[marker], self.count[marker] = now, self.api.applied[body]
                for messages in batches.values():
                    for m in messages:
                        found = (m.key or b"") + b"|" + (m.value or b"")
                        for marker in self.markers:
                            if marker in found:
                                self.seen.setdefault(marker, now)
                                self.count[marker] += 1


async def test_records_at_the_edges_of_size_and_clock_stop_no_partition(
    broker: str, tmp_path: Path, api: OrderApi
) -> None:
    """On every input: a 2 MB value, a 1 MB key, an invalid 900 KB value (and on events a
    far-future event), each followed by a valid record on the same partition. Each
    valid one comes out once, soon; each poison is dead-lettered once with its reason,
    cut to fit where it must; the worker never restarts."""
    pipeline = await everything(broker, tmp_path, api).create_topics()
    conf = pipeline.conf
    cases = edge_inputs(conf)
    inputs = sorted({poison[0] for poison, _ in cases})
    async with admin_client(conf) as admin:
        topics = [
            ConfigResource(ConfigResourceType.TOPIC, t, {"max.message.bytes": "4194304"})
            for t in inputs
        ]
        await admin.alter_configs(topics)
    outputs = [
        conf.pairs_topic,
        conf.validated_topic,
        f"{conf.app_id}-accounts-changelog",
        f"{conf.app_id}-enrichment-changelog",
        conf.match_topic("each"),
    ]
    watch = Watch(pipeline, outputs, [marker for _, (_, _, marker) in cases], api)
    watch.orders = {
        marker: records[0][1].decode()
        for _, (topic, records, marker) in cases
        if topic == conf.delivery_source
    }
    worker = pipeline.worker().start()
    producer = AIOKafkaProducer(
        **conf.kafka.aiokafka(), enable_idempotence=True, max_request_size=2**22
    )
    await producer.start()
    sent: dict[bytes, float] = {}
    watching: asyncio.Future[None] | None = None
    try:
        await worker.wait_ready()  # the changelogs exist: watch them from their start
        watching = asyncio.ensure_future(watch.run())
        opened = b'{"account":"acct-ok","status":"open"}'
        await producer.send_and_wait(conf.accounts_topic, opened, key=b"acct-ok")
        await until(worker, "acct-ok open", lambda: has(pipeline, "accounts", "a:acct-ok"))
        for (topic, _, key, value), (_, records, marker) in cases:
            await producer.send_and_wait(topic, value, key=key, partition=EDGE_PARTITION)
            for record_key, record in records:
                await producer.send_and_wait(
                    topic, record, key=record_key, partition=EDGE_PARTITION
                )
            if topic in pattern_inputs(conf):
                for partition, later in moving_on(records[-1][1], conf.partitions):
                    await producer.send_and_wait(topic, later, partition=partition)
            sent[marker] = time.monotonic()

        async def out() -> bool:
            return all(marker in watch.seen for marker in sent)

        await until(worker, "every valid record after a poison out", out, timeout=120)
        deadline = time.monotonic() + 60
        while behind := await lag(pipeline):
            assert time.monotonic() < deadline, f"input partitions not committed: {behind}"
            await asyncio.sleep(0.5)  # a commit interval
    finally:
        if watching is not None:
            watching.cancel()
        await producer.stop()
        worker.stop()
    assert worker.unplanned_restarts == 0

    waited = {marker.decode(): round(watch.seen[marker] - sent[marker], 2) for marker in sent}
    print(f"\nseconds from each valid record's send to its output: {waited}")
    assert max(waited.values()) < STALL_SECONDS, waited
    assert {m.decode(): n for m, n in watch.count.items() if n != 1} == {}  # once each

    letters: list[tuple[bytes | None, dict[str, Any]]] = []
    for topic in {
        conf.dead_letter_topic,
        conf.deposits_dead_letter_topic,
        conf.sources_dead_letter_topic,
        conf.delivery_dead_letter_topic,
    }:
        for partition in await read_partitions(conf, topic):
            for key, value in partition:
                assert value is not None and len(value) + len(key or b"") <= conf.max_record_bytes
                letters.append((key, json.loads(value)))
    positions = Counter(
        (d["source_topic"], d["source_partition"], d["source_offset"]) for _, d in letters
    )
    assert [p for p, n in positions.items() if n > 1] == []
    for (topic, reason, key, value), _ in cases:
        found = [
            (k, d)
            for k, d in letters
            if d["source_topic"] == topic and d["reason"].startswith(reason)
        ]
        assert len(found) == 1, (topic, reason, len(found))
        ((dead_key, letter),) = found
        if key is not None and len(key) > conf.max_key_bytes:
            assert dead_key == f"sha256:{hashlib.sha256(key).hexdigest()}".encode()
            assert letter["key_bytes"] == len(key)
        if "value_prefix" in letter:
            assert letter["value_bytes"] == len(value)
            assert letter["value_sha256"] == hashlib.sha256(value).hexdigest()
            assert value.startswith(letter["value_prefix"].encode())
        else:
            assert dead_lettered_bytes(letter) == value


async def has(pipeline: Pipeline, name: str, key: str) -> bool:
    return key in await table(pipeline, name)
