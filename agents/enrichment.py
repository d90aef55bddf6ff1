"""Enrichment: each pair joined with its day's row of the reference table
(`sources`, compacted, keyed `YYYY-MM-DD`) into `pairs.enriched`, exactly once.
Imported only when PAIRSTREAM_ENRICHMENT_ENABLED is set.

    sources ──broadcast──▶ <app>-sources-by-partition (each row to every partition) ─┐
    pairs ───────────────────────────────────────────────────────────────enrich─┴─▶ pairs.enriched

Rows are few and every pair partition needs them all (a day's pairs spread over all
partitions), so each row is copied to every partition, as a global table would be,
but inside the transactions, so each partition's copy is part of its own state. The
rules are in pairing/enrichment.py.
"""

from __future__ import annotations

import time
from typing import Any

from faust.types import TP

from app.exactly_once.in_order import events_once
from app.exactly_once.outbox import Outbox
from app.exactly_once.partition_tasks import PartitionTask
from app.exactly_once.stage import Stage
from app.exactly_once.step import exactly_once
from app.faust_app import app
from app.settings import settings
from app.topics import bytes_topic
from pairing.enrichment import (
    Enriched,
    Enricher,
    Waiting,
    decode_waiting,
    encode_waiting,
    enriched_record,
    row_rejection,
)
from pairing.grammar import Rejection, oversize_invalid, parse_timestamp
from pairing.records import TICK, Source
from tables import TableWriter, bytes_table

conf = settings()
ROWS = conf.sources_by_partition_topic
DLQ = conf.sources_dead_letter_topic
DELETED = b""  # a deleted row, as stored

# Per partition p: `r:<p>:<day>` -> its row (DELETED once deleted), `w:<p>:<pair key>` ->
# a pair waiting for its row.
state = bytes_table("enrichment", conf.partitions, [conf.pairs_topic, ROWS])

sources = bytes_topic(conf.sources_topic, internal=False)
joined = bytes_topic(conf.pairs_topic, ROWS, internal=False)  # co-partitioned
STAGE = Stage(ROWS, processor_of=conf.pairs_topic)  # the pairs' task keeps the Enricher


@app.agent(sources)
async def broadcast_rows(stream: Any) -> None:
    async for event in events_once(app, stream):
        message = event.message
        async with exactly_once(app, event, dead_letters=DLQ) as task:
            reason = oversize_invalid(message.key, message.value, conf.sizes) or row_rejection(
                message.key, message.value
            )
            if reason is not None:
                where = Source(message.topic, message.partition, message.offset)
                task.outbox.dead_letter(DLQ, reason, message.key, message.value, where)
                task.outbox.count("dead_lettered")
                continue
            task.outbox.count("rows")
            for partition in range(conf.partitions):
                task.outbox.send(ROWS, message.key, message.value, partition)


def load(task: PartitionTask) -> Enricher:
    """A pair partition's rows and waiting pairs, from its table (after the restore)."""
    enricher = Enricher(
        int(conf.enrichment_bound_seconds * 1_000_000), conf.enrichment_max_wait_seconds
    )
    rows, waiting = f"r:{task.tp.partition}:".encode(), f"w:{task.tp.partition}:".encode()
    for key, value in TableWriter(state, task).items():
        if key.startswith(rows):
            enricher.rows[key[len(rows) :].decode()] = None if value == DELETED else value
        elif key.startswith(waiting):
            enricher.hold(decode_waiting(value))
    return enricher


@app.agent(joined)
async def enrich(stream: Any) -> None:
    tasks = app.partition_tasks
    async for event in events_once(app, stream):
        message = event.message
        partition = message.partition
        key_bytes: bytes | None = message.key
        value: bytes | None = message.value
        assert key_bytes is not None  # broadcast and pairing always set the key
        async with exactly_once(app, event, dead_letters=DLQ) as task:
            pair_task = tasks.get(TP(conf.pairs_topic, partition))
            assert pair_task is not None  # assigned together with this partition
            enricher = pair_task.processor(Enricher, load)
            table = TableWriter(state, task)
            if message.topic == ROWS:
                if value == TICK:
                    out = enricher.tick(time.time())
                else:
                    day = key_bytes.decode()
                    stored = DELETED if value is None else value
                    table.put(f"r:{partition}:{day}".encode(), stored)
                    out = enricher.row(day, value)
            else:
                key = key_bytes.decode()
                parsed = parse_timestamp(key)
                assert not isinstance(parsed, Rejection) and value is not None  # from pairing
                out, held = enricher.pair(key, value, parsed[1], time.time())
                if held is not None:
                    table.put(_waiting_key(partition, held), encode_waiting(held))
            for enriched in out:
                emit(table, task.outbox, enriched, partition)


def _waiting_key(partition: int, waiting: Waiting | Enriched) -> bytes:
    return f"w:{partition}:{waiting.key}".encode()


def emit(table: TableWriter, outbox: Outbox, enriched: Enriched, partition: int) -> None:
    if enriched.waited:
        table.delete(_waiting_key(partition, enriched))
    outbox.count("enriched" if enriched.reason is None else f"unenriched_{enriched.reason}")
    outbox.send(conf.enriched_topic, enriched.key.encode(), enriched_record(enriched), partition)


@app.timer(interval=conf.tick_interval_seconds, on_leader=True)
async def tick_enrichment() -> None:
    """Pairs of a quiet stream stop waiting after max wait (wall clock)."""
    for partition in range(conf.partitions):
        await app.producer.send(ROWS, b"~tick", TICK, partition, None, None)
