"""Ingest: validate each input record once, dead-letter what is invalid, and
re-key valid events by pairing key so A and B of one timestamp meet."""

from __future__ import annotations

from typing import Any

from app.exactly_once import events_once, exactly_once
from app.faust_app import app
from app.settings import settings
from app.topics import dead_letters, events, keyed_events
from pairing.events import Rejection, parse_event
from pairing.records import Source, dead_letter_record, encode_keyed_event
from pairing.routing import partition_for

conf = settings()


@app.agent(events)
async def ingest(stream: Any) -> None:
    keyed_topic = keyed_events.get_topic_name()
    dlq_topic = dead_letters.get_topic_name()
    async for event in events_once(app, stream):
        message = event.message
        raw: bytes | None = message.value
        source = Source(message.topic, message.partition, message.offset)
        async with exactly_once(app, event) as step:
            step.count("events_in")
            parsed = parse_event(raw, conf.max_event_bytes)
            if isinstance(parsed, Rejection):
                step.count("dead_lettered")
                step.send(
                    dlq_topic, message.key, dead_letter_record(parsed.reason, raw, source), None
                )
                continue
            assert raw is not None  # a valid event has a body
            step.count("valid")
            partition = partition_for(parsed.key, conf.partitions)
            step.send(
                keyed_topic, parsed.key.encode(), encode_keyed_event(parsed, raw, source), partition
            )
