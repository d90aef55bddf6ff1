"""The deposit chain against the real broker, with workers SIGKILLed and
scaled 1 -> 2 -> 1 while deposits flow: every account's balance in the validation
table, in its last validated record and in the ledger equals the exact sum of its
valid distinct deposits (the model in tools/deposits.py); no deposit is validated
twice; every invalid or rejected one is dead-lettered once. All read with
read_committed.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path

import aiohttp
import pytest

from pairing.deposits import decode_account, decode_totals
from tests.integration.harness import Pipeline, Worker, read_partitions, stop_workers, table
from tools.deposits import ChainShape, Expected, account_records, deposit_records, expected
from tools.generate import produce

pytestmark = pytest.mark.broker

# make test: 100 accounts, 2,000 deposits, one kill; make chain: 1,000, 20,000 and three.
ACCOUNTS = int(os.environ.get("PAIRSTREAM_CHAIN_ACCOUNTS", "100"))
DEPOSITS = int(os.environ.get("PAIRSTREAM_CHAIN_DEPOSITS", "2000"))
KILLS = int(os.environ.get("PAIRSTREAM_CHAIN_KILLS", "1"))


def chain_pipeline(broker: str, tmp: Path) -> Pipeline:
    name = f"chain-{tmp.name[-20:]}-{random.randrange(10**6)}"
    return Pipeline(
        broker,
        tmp,
        PAIRSTREAM_CHAIN_ENABLED="true",
        PAIRSTREAM_DEPOSITS_TOPIC=f"{name}-deposits",
        PAIRSTREAM_ACCOUNTS_TOPIC=f"{name}-accounts",
        PAIRSTREAM_VALIDATED_TOPIC=f"{name}-deposits.validated",
        PAIRSTREAM_DEPOSITS_DEAD_LETTER_TOPIC=f"{name}-deposits.dlq",
    )


async def count(pipeline: Pipeline, topic: str) -> int:
    return sum(len(p) for p in await read_partitions(pipeline.conf, topic))


async def until(check: object, workers: list[Worker], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await check():  # type: ignore[operator]
        for worker in workers:
            worker.restart_if_exited()
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {timeout}s")
        await asyncio.sleep(1)  # polling committed topics


async def run_chain(broker: str, tmp: Path, shape: ChainShape, scale: bool) -> None:
    pipeline = chain_pipeline(broker, tmp)
    conf = pipeline.conf
    await pipeline.create_topics()
    accounts, deposits = account_records(shape), deposit_records(shape)
    model = expected(accounts, deposits)
    await produce(accounts, conf.kafka, conf.accounts_topic, 0, False)
    workers = [pipeline.worker(0)]
    workers[0].start()
    rng = random.Random(shape.seed)
    try:
        await workers[0].wait_ready()

        async def accounts_applied() -> bool:
            rows = await table(pipeline, "accounts")
            return sum(k.startswith("a:") for k in rows) == shape.accounts

        # Account changes first: validation reads accounts as a table, in processing order.
        await until(accounts_applied, workers, 300, "accounts applied")
        producing = asyncio.create_task(
            produce(deposits, conf.kafka, conf.deposits_topic, len(deposits) / 15, False)
        )
        for point in sorted(rng.uniform(0.1, 0.8) for _ in range(KILLS)):
            await until(
                lambda p=point: _validated_share(pipeline, model, p), workers, 300, "progress"
            )
            workers[0].kill()
            workers[0].start()
        if scale:
            workers.append(pipeline.worker(1).start())
            await workers[1].wait_ready()
            await until(lambda: _validated_share(pipeline, model, 0.9), workers, 300, "progress")
            await stop_workers([workers[1]])
            assert workers[1].forced_stops == 0, workers[1].log()[-3000:]
        await producing

        async def ledger_complete() -> bool:
            rows = await table(pipeline, "ledger")
            return sum(decode_totals(v).count for v in rows.values()) >= model.validated

        await until(ledger_complete, workers, 300, "ledger complete")
        await until(
            lambda: _count_at_least(pipeline, conf.deposits_dead_letter_topic, model.dead_lettered),
            workers,
            120,
            "dead letters",
        )
        await check_account_page(workers[0], model)
    finally:
        await stop_workers(workers)
    for worker in workers:
        assert worker.unplanned_restarts == 0, worker.log()[-3000:]
    await check(pipeline, model)


async def _validated_share(pipeline: Pipeline, model: Expected, share: float) -> bool:
    return await count(pipeline, pipeline.conf.validated_topic) >= share * model.validated


async def _count_at_least(pipeline: Pipeline, topic: str, least: int) -> bool:
    return await count(pipeline, topic) >= least


async def check_account_page(worker: Worker, model: Expected) -> None:
    account = max(model.balances, key=lambda a: model.counts[a])
    url = f"http://127.0.0.1:{worker.web_port}/accounts/{account}"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert response.status == 200, await response.text()
        page = await response.json()
    assert Decimal(page["total"]) == model.balances[account]
    assert page["count"] == model.counts[account]


async def check(pipeline: Pipeline, model: Expected) -> None:
    conf = pipeline.conf
    state = {
        k[2:]: decode_account(v)
        for k, v in (await table(pipeline, "accounts")).items()
        if k.startswith("a:")
    }
    ledger = {k: decode_totals(v) for k, v in (await table(pipeline, "ledger")).items()}
    validated = [
        json.loads(v) for p in await read_partitions(conf, conf.validated_topic) for _, v in p if v
    ]
    ids = Counter((v["account"], v["deposit_id"]) for v in validated)
    assert max(ids.values()) == 1, "a deposit validated twice"
    assert len(validated) == model.validated
    last_balance = {v["account"]: Decimal(v["balance"]) for v in validated}  # in partition order
    assert last_balance == model.balances
    assert {a: s.balance for a, s in state.items() if s.deposits} == model.balances
    assert {a: t.total for a, t in ledger.items()} == model.balances
    assert {a: t.count for a, t in ledger.items()} == dict(model.counts)
    assert {a: t.balance for a, t in ledger.items()} == model.balances
    dead = [
        json.loads(v)
        for p in await read_partitions(conf, conf.deposits_dead_letter_topic)
        for _, v in p
        if v
    ]
    assert len(dead) == model.dead_lettered
    assert all(d["reason"].startswith(("invalid: ", "rejected: ")) for d in dead)
    print(
        f"\nchain: {len(validated)} validated over {len(model.balances)} accounts,"
        f" {len(dead)} dead-lettered ({Counter(d['reason'] for d in dead).most_common(4)})"
    )


@pytest.mark.matrix
async def test_chain_worker_hard_kill(broker: str, tmp_path: Path) -> None:
    """The fault matrix's worker hard kill, on the chain."""
    await run_chain(broker, tmp_path, ChainShape(ACCOUNTS, DEPOSITS, seed=31), scale=False)


@pytest.mark.long
async def test_chain_through_kills_and_scaling(broker: str, tmp_path: Path) -> None:
    await run_chain(broker, tmp_path, ChainShape(ACCOUNTS, DEPOSITS, seed=32), scale=True)
