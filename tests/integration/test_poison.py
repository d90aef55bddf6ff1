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
import json
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiokafka import TopicPartition
from faust.types import TP

from app.kafka.admin import admin_client, end_offsets
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


def everything(broker: str, tmp: Path, api: OrderApi) -> Pipeline:
    name = Pipeline(broker, tmp).conf.app_id
    return Pipeline(
        broker,
        tmp,
        PAIRSTREAM_APP_ID=name,
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


async def lag(pipeline: Pipeline) -> dict[str, int]:
    """Input partitions whose committed offset is short of their end, by how much."""
    conf = pipeline.conf
    topics = [conf.deposits_topic, conf.accounts_topic, conf.sources_topic, conf.delivery_source]
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
