"""Every topic the pipeline reads or writes. Values are raw bytes: the
pairing code parses and encodes them itself, once."""

from __future__ import annotations

import faust

from app.faust_app import app
from app.settings import settings

conf = settings()


# Runs (app/exactly_once/runs.py) the agent of such a topic may have waiting: about as many records
# as faust's default buffer of 4096 messages, where 4096 runs would hold a backlog of up
# to 4096 x max_run_records records in memory ahead of the agent.
RUNS_BUFFERED = max(2, 4096 // conf.max_run_records)


def bytes_topic(
    *names: str,
    internal: bool = False,
    partitions: int = conf.partitions,
    buffered: int | None = None,
) -> faust.TopicT:
    """A topic (or several, consumed together) of raw bytes; `internal`: faust creates it;
    `buffered`: messages its agent may have waiting (faust's default if None)."""
    topic = app.topic(
        *names,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
        partitions=partitions,
        replicas=conf.replication_factor,
        internal=internal,
    )
    # app.topic takes a maxsize but does not hand it on to the topic (faust 0.15.3).
    topic.maxsize = buffered
    return topic


# Internal: faust creates it before subscribing, so a worker started before its
# input exists consumes it (a topic missing at subscription was ignored for good).
# `events_partitions` only sizes it when it does not exist (app/exactly_once/input_partitions.py).
events = bytes_topic(
    conf.events_topic, internal=True, partitions=conf.events_partitions, buffered=RUNS_BUFFERED
)
# Events re-keyed by timestamp.
keyed_events = bytes_topic(conf.keyed_topic, internal=True, buffered=RUNS_BUFFERED)
pairs = bytes_topic(conf.pairs_topic)
unpaired = bytes_topic(conf.unpaired_topic)
dead_letters = bytes_topic(conf.dead_letter_topic)

SINKS = (pairs, unpaired, dead_letters)
