"""Enrichment of pairs from the reference table against the real broker:
a present, a missing, a late, a changed and a deleted row, with the worker SIGKILLed
in the middle; every pair comes out once, with the row (or flag) its day had."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import Pipeline, Worker, read_partitions, stop_workers
from tools.generate import Record, produce

pytestmark = pytest.mark.broker

ROWS = {
    "present": b'{"tariff": "peak"}',
    "late": b'{"tariff": "late"}',
    "before": b'{"tariff": "before change"}',
    "after": b'{"tariff": "after change"}',
    "deleted": b'{"tariff": "soon deleted"}',
}
DAYS = {
    "present": "2024-03-01",
    "late": "2024-03-02",
    "missing": "2024-03-03",
    "changed": "2024-03-04",
    "deleted": "2024-03-05",
}
PER_PHASE = 40  # pairs per day and phase: every partition gets some


def pairs_of(day: str, first: int) -> list[Record]:
    records: list[Record] = []
    for n in range(first, first + PER_PHASE):
        key = f"{day}T10:{n // 60:02d}:{n % 60:02d}Z"
        records.append((key.encode(), json.dumps({"timestamp": key, "sum": n}).encode()))
    return records


async def enriched(pipeline: Pipeline) -> list[dict[str, Any]]:
    conf = pipeline.conf
    return [
        json.loads(v) for p in await read_partitions(conf, conf.enriched_topic) for _, v in p if v
    ]


async def until_out(pipeline: Pipeline, worker: Worker, count: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while len(await enriched(pipeline)) < count:
        worker.restart_if_exited()
        assert time.monotonic() < deadline, f"fewer than {count} enriched pairs after {timeout}s"
        await asyncio.sleep(1)  # polling the committed output


@pytest.mark.matrix  # the fault matrix's worker hard kill, on enrichment
async def test_present_missing_late_changed_and_deleted_rows_through_a_kill(
    broker: str, tmp_path: Path
) -> None:
    pipeline = Pipeline(broker, tmp_path, PAIRSTREAM_ENRICHMENT_ENABLED="true")
    name = pipeline.conf.app_id
    pipeline = Pipeline(
        broker,
        tmp_path,
        PAIRSTREAM_APP_ID=name,
        PAIRSTREAM_ENRICHMENT_ENABLED="true",
        PAIRSTREAM_SOURCES_TOPIC=f"{name}-sources",
        PAIRSTREAM_ENRICHED_TOPIC=f"{name}-pairs.enriched",
        PAIRSTREAM_SOURCES_DEAD_LETTER_TOPIC=f"{name}-sources.dlq",
        # Only max wait ends a wait here: the days are far apart in event time.
        PAIRSTREAM_ENRICHMENT_BOUND_SECONDS=str(30 * 86400),
        PAIRSTREAM_ENRICHMENT_MAX_WAIT_SECONDS="40",
        PAIRSTREAM_TICK_INTERVAL_SECONDS="1",
    )
    conf = pipeline.conf
    await pipeline.create_topics()

    async def rows(*records: tuple[str, bytes | None]) -> None:
        keyed = [(day.encode(), row) for day, row in records]
        await produce(keyed, conf.kafka, conf.sources_topic, 0, False)

    async def pairs(records: list[Record]) -> None:
        await produce(records, conf.kafka, conf.pairs_topic, 0, False)

    async def applied(changes: int) -> None:
        """Until `changes` row changes reached every partition's state (as committed)."""
        changelog = f"{name}-enrichment-changelog"
        deadline = time.monotonic() + 180
        while True:
            written = [k for p in await read_partitions(conf, changelog) for k, _ in p]
            if sum(bool(k and k.startswith(b"r:")) for k in written) >= changes * conf.partitions:
                return
            worker.restart_if_exited()
            assert time.monotonic() < deadline, "rows not applied"
            await asyncio.sleep(1)  # polling the committed state

    worker = pipeline.worker().start()
    try:
        await worker.wait_ready()
        await rows(
            (DAYS["present"], ROWS["present"]),
            (DAYS["changed"], ROWS["before"]),
            (DAYS["deleted"], ROWS["deleted"]),
            ("not-a-day", b"{}"),
            ("2024-02-30", b"{}"),
            # Braces around it passed the old check: stored, it met the missing day's pairs
            # and crashed enrichment (JSONDecodeError) again and again.
            (DAYS["missing"], b"{not json}"),
        )
        await applied(3)
        # Pairs whose row comes later or never, then pairs whose row is there.
        await pairs(pairs_of(DAYS["late"], 0) + pairs_of(DAYS["missing"], 0))
        await pairs(
            pairs_of(DAYS["present"], 0)
            + pairs_of(DAYS["changed"], 0)
            + pairs_of(DAYS["deleted"], 0)
        )
        await until_out(pipeline, worker, 3 * PER_PHASE)
        await rows((DAYS["late"], ROWS["late"]))
        await until_out(pipeline, worker, 4 * PER_PHASE)  # the late row's pairs
        worker.kill()  # with the missing row's pairs waiting in its state
        worker.start()
        await worker.wait_ready()
        await rows((DAYS["changed"], ROWS["after"]), (DAYS["deleted"], None))
        await applied(6)
        await pairs(pairs_of(DAYS["changed"], PER_PHASE) + pairs_of(DAYS["deleted"], PER_PHASE))
        await until_out(pipeline, worker, 7 * PER_PHASE)  # and the missing ones, after max wait
    finally:
        await stop_workers([worker])
    assert worker.unplanned_restarts == 0, worker.log()[-3000:]
    out = await enriched(pipeline)
    keys = Counter(o["pair"]["timestamp"] for o in out)
    assert len(keys) == 7 * PER_PHASE and max(keys.values()) == 1, "a pair enriched twice"
    seen = Counter(
        (o["pair"]["timestamp"][:10], o["reason"], json.dumps(o["reference"])) for o in out
    )
    ref = {k: json.dumps(json.loads(v)) for k, v in ROWS.items()}
    assert seen == Counter(
        {
            (DAYS["present"], None, ref["present"]): PER_PHASE,
            (DAYS["late"], None, ref["late"]): PER_PHASE,
            (DAYS["missing"], "missing", "null"): PER_PHASE,
            (DAYS["changed"], None, ref["before"]): PER_PHASE,
            (DAYS["changed"], None, ref["after"]): PER_PHASE,
            (DAYS["deleted"], None, ref["deleted"]): PER_PHASE,
            (DAYS["deleted"], "deleted", "null"): PER_PHASE,
        }
    ), seen
    dead = [
        json.loads(v)
        for p in await read_partitions(conf, conf.sources_dead_letter_topic)
        for _, v in p
        if v
    ]
    reasons = sorted(d["reason"] for d in dead)
    assert reasons[:2] == [
        "invalid: key is not a calendar day: 2024-02-30",
        "invalid: key must be a day, YYYY-MM-DD",
    ]
    assert len(reasons) == 3 and reasons[2].startswith("invalid: row: malformed JSON"), reasons
