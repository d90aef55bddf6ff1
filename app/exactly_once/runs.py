"""Runs: the records of one partition that one fetch returned, in offset order, handed
to the partition's agent as one message.

faust hands every fetched record on by itself: a message, a task's hand-over through
the conductor, a queue put and get into the agent's channel, an event, a turn of the
stream's iterator and of the agent's loop. That machinery, not the rules, was most of
a worker's CPU. A stage that takes its records in runs
(`PartitionTasks.in_runs`) goes through it once per run instead: the consumer
(consumer.py, `_getmany`) wraps what a fetch returned of each of its partitions in
`Run`s, which faust's fetch loop, conductor and stream carry like any record, and the
agent's step processes a run's records together (app/exactly_once/in_order.py `runs_once`,
app/exactly_once/step.py `exactly_once`).

A run is a message whose offset is that of its last record, so faust's fetcher (which
drops what is below its last-read offset) and its acks treat it as that record; its
value is the records themselves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from faust.types import TP


class Run:
    """Consecutive fetched records of one partition, shaped as the one record faust's
    consumer turns into a message (`_to_message` reads these attributes). The records
    are as the record batch decoded them (app/exactly_once/internals.py `hand_on_decoded_records`):
    offset, timestamp, key and value, but no topic or partition."""

    __slots__ = ("offset", "partition", "timestamp", "topic", "value")

    # faust copies these into its message; a run has none of its own.
    timestamp_type = 0
    headers: Sequence[tuple[str, bytes]] = ()
    key = None
    checksum = None
    serialized_key_size = 0
    serialized_value_size = 0

    def __init__(self, tp: TP, records: Sequence[Any]) -> None:
        last = records[-1]
        self.topic: str = tp.topic
        self.partition: int = tp.partition
        self.offset: int = last.offset
        self.timestamp: int | None = last.timestamp
        self.value: Sequence[Any] = records


def in_runs(
    fetched: Mapping[TP, list[Any]], topics: Mapping[str, int | None], max_records: int
) -> dict[TP, list[Any]]:
    """What a fetch returned, with the records of `topics` in runs of at most the
    topic's run size, or `max_records` (one run holds the event loop while it is
    processed)."""
    result: dict[TP, list[Any]] = {}
    for tp, records in fetched.items():
        if tp.topic in topics and records:
            size = topics[tp.topic] or max_records
            result[tp] = [
                Run(tp, records[start : start + size]) for start in range(0, len(records), size)
            ]
        else:
            result[tp] = records
    return result
