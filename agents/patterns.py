"""Patterns over the stream (docs/patterns.md): the pattern file's inputs routed by each
pattern key, and every declared pattern matched over its key's events in event time,
exactly once. Imported only when PAIRSTREAM_PATTERNS_FILE is set.

    [input] topics ──route──▶ <app>-pattern-events ──match──▶ matches.<pattern>, one each
                  (key: each pattern key field)      └──▶ the dead-letter topic (late)
       └──▶ the dead-letter topic (invalid)

Event time is pairing's: the router stamps each event with its input partition's
progress and tells every partition of the pattern events how far each input partition
has got (agents/event_time.py); a partition's patterns advance as its watermark does.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from agents.event_time import EventTimeTeller, record_source
from app.exactly_once.in_order import runs_once
from app.exactly_once.outbox import Outbox
from app.exactly_once.partition_tasks import PartitionTask
from app.exactly_once.stage import Stage
from app.exactly_once.step import RunRecords, run_once
from app.faust_app import app
from app.settings import settings
from app.topics import RUNS_BUFFERED, bytes_topic, dead_letters
from pairing.events import Rejection
from pairing.pattern_engine import PatternEngine
from pairing.pattern_input import read_pattern_event
from pairing.pattern_partition import Decided, PatternPartition
from pairing.pattern_records import (
    RoutedPatternEvent,
    decode_pattern_event,
    encode_pattern_event,
    match_record,
)
from pairing.pattern_state import Refused, key_text
from pairing.pattern_store import StateNotStored
from pairing.records import decode_watermark, loads
from pairing.routing import partition_for
from tables.pattern_state import PatternTable
from tables.pattern_state import progress as progress_table

conf = settings()
DECLARED = conf.patterns
assert DECLARED is not None and DECLARED.input is not None  # imported with a file
INPUT = DECLARED.input
INPUTS = list(INPUT.topics)
FIELDS = DECLARED.fields()
KEY_FIELDS = sorted({pattern.key for pattern in DECLARED.patterns})
BY_NAME = {pattern.name: pattern for pattern in DECLARED.patterns}
ENGINES = [PatternEngine(pattern, conf.pattern_max_partials) for pattern in DECLARED.patterns]
ROUTED = conf.pattern_events_topic

inputs = bytes_topic(*INPUTS, buffered=RUNS_BUFFERED)  # created by the worker if missing
routed = bytes_topic(ROUTED, internal=True, buffered=RUNS_BUFFERED)

# Input partition p of the file's i-th topic is source i x partitions + p: every input
# has PAIRSTREAM_PARTITIONS partitions (checked at start, app/worker.py).
EVENT_TIME = EventTimeTeller(
    app,
    topics=INPUTS,
    keyed_topic=ROUTED,
    partitions=conf.partitions,
    number=lambda tp: INPUTS.index(tp.topic) * conf.partitions + tp.partition,
    count=lambda: len(INPUTS) * conf.partitions,
    progress_table=progress_table,
    interval=conf.pattern_watermark_interval_seconds,
)

# A routed event is added to every pattern of its key field: a run of them holds at
# most ten runs' worth of pattern additions (ten patterns: a whole run), so that a step
# holds the event loop for a bounded time and commits behind it stay within the
# transaction timeout (docs/patterns.md, Figures).
PER_KEY_FIELD = max(Counter(pattern.key for pattern in DECLARED.patterns).values(), default=1)
MATCH_RUN_RECORDS = max(1, min(conf.max_run_records, conf.max_run_records * 10 // PER_KEY_FIELD))

STAGES = [
    *(
        Stage(
            topic,
            in_runs=True,
            before_commit=EVENT_TIME.before_commit,
            on_revoke=EVENT_TIME.on_revoke if n == 0 else None,  # it looks at every input
        )
        for n, topic in enumerate(INPUTS)
    ),
    Stage(ROUTED, in_runs=True, run_records=MATCH_RUN_RECORDS),
]


@app.agent(inputs)
async def route(stream: Any) -> None:
    """Each run of an input partition's records in one step (app/exactly_once/runs.py)."""
    dlq_topic = dead_letters.get_topic_name()
    async for event, records in runs_once(app, stream):
        await run_once(app, event, records, route_run, dead_letters=dlq_topic)


def route_run(task: PartitionTask, records: RunRecords) -> None:
    """Read a run's records by the file's [input]; send each valid event to the
    partition of each pattern key it has, stamped; dead-letter what is invalid."""
    dlq_topic = dead_letters.get_topic_name()
    outbox = task.outbox
    now = time.time()
    now_ms = int(now * 1000)
    sizes, max_ahead_us = conf.sizes, conf.max_ahead_us
    source = EVENT_TIME.source(task)
    stored = source.progress_us
    topic = task.tp.topic
    outbox.count("pattern_inputs_in", len(records))
    rejected = 0
    for record in records.each():
        raw: bytes | None = record.value
        source_of, timestamp_ms = record_source(task, record, now_ms)
        guard = None if max_ahead_us is None else (timestamp_ms, max_ahead_us)
        event = read_pattern_event(record.key, raw, topic, INPUT, FIELDS, sizes, guard)
        if isinstance(event, Rejection):
            rejected += 1
            outbox.dead_letter(dlq_topic, event.reason, record.key, raw, source_of)
            continue
        stamp = source.observe(event.time, now)
        if source.must_announce:
            # Ahead of its event, as ingest does (agents/ingest.py says why).
            outbox.send_all(EVENT_TIME.tell(task, source, now))
        for field in KEY_FIELDS:
            key = key_text(event.fields.get(field))
            if key is None:
                continue
            value = encode_pattern_event(RoutedPatternEvent(event, field, source_of, stamp))
            outbox.send(ROUTED, key.encode(), value, partition_for(key, conf.partitions))
    if rejected:
        outbox.count("pattern_inputs_invalid", rejected)
    if source.progress_us is not None and source.progress_us != stored:
        EVENT_TIME.store(task, source.progress_us)


class MatchPartition:
    """The declared patterns over one partition of the pattern events (a partition
    task's processor): rebuilt from the table after every rebalance."""

    __slots__ = ("patterns", "table")

    def __init__(self, task: PartitionTask) -> None:
        self.table = PatternTable(task)
        self.patterns = PatternPartition(
            ENGINES, self.table.store, self.table.clock(), conf.pattern_lateness_us
        )


@app.agent(routed)
async def match(stream: Any) -> None:
    """Each run of a partition's pattern events and watermarks in one step."""
    dlq_topic = dead_letters.get_topic_name()
    async for event, records in runs_once(app, stream):
        await run_once(app, event, records, match_run, dead_letters=dlq_topic)


def match_run(task: PartitionTask, records: RunRecords) -> None:
    """Add a run's events to the patterns that key them; advance them as the sources'
    progress comes; publish what they decide."""
    outbox = task.outbox
    partition = task.processor(MatchPartition, MatchPartition)
    patterns = partition.patterns
    store = partition.table.store
    watermarks = 0
    for record in records.each():
        store.record = records.current
        value: bytes | None = record.value
        assert value is not None  # written by the router, never empty
        if value[:1] == b"[":  # an event (a watermark record is a JSON object)
            routed_event = decode_pattern_event(value)
            refused = patterns.add(
                routed_event.event, routed_event.progress_us, routed_event.key_field
            )
            if refused:
                settle_refused(refused, routed_event, record.key, value, outbox)
            continue
        watermarks += 1
        decided = patterns.observe(decode_watermark(loads(value)))
        if decided.matches or decided.dropped:
            publish(decided, outbox)
    try:
        partition.table.flush(patterns.clock if watermarks else None)
    except StateNotStored as refused:
        # Written as the step ends, the state is that of the record that changed it last:
        # that record is dead-lettered, and the run handled again without it (run_once).
        records.current = refused.record
        raise
    outbox.count("pattern_events_in", len(records) - watermarks)
    if watermarks:
        outbox.count("watermarks", watermarks)


def settle_refused(
    refused: list[tuple[str, Refused]],
    routed_event: RoutedPatternEvent,
    key: bytes | None,
    value: bytes,
    outbox: Outbox,
) -> None:
    """A duplicate is counted; a late event is counted and dead-lettered once, naming
    the patterns that refused it (what it is: the routed record, its fields read)."""
    late = [name for name, why in refused if why.reason == "late"]
    if len(late) < len(refused):
        outbox.count("pattern_duplicates", len(refused) - len(late))
    if late:
        outbox.count("pattern_late", len(late))
        reason = (
            f"late for patterns {', '.join(late)}: more than the lateness behind its input"
            " partition's progress, or at or before the patterns' watermark"
        )
        outbox.dead_letter(
            dead_letters.get_topic_name(),
            reason,
            key,
            value,
            routed_event.source,
            routed_event.event.identity,
        )


def publish(decided: Decided, outbox: Outbox) -> None:
    for found in decided.matches:
        pattern = BY_NAME[found.pattern]
        outbox.send(
            conf.match_topic(found.pattern),
            found.key.encode(),
            match_record(found, pattern),
            None,
        )
    if decided.matches:
        outbox.count("matches", len(decided.matches))
    if decided.dropped:
        outbox.count("pattern_partials_dropped", decided.dropped)


@app.timer(interval=EVENT_TIME.look_every)
async def tell_caught_up_inputs() -> None:
    """Caught-up input partitions tell their progress, and go idle (agents/event_time.py)."""
    await EVENT_TIME.tell_caught_up()
