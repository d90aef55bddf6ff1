"""Sending a partition task's outbox into the open transaction of its partition: after
each step (step.py), and, for the steps held while that transaction committed, once
the next one has begun (commit.py)."""

from __future__ import annotations

import time

from faust.types import AppT

from app.exactly_once.outbox import send_in_transaction
from app.exactly_once.partition_tasks import PartitionTask
from app.exactly_once.stats import Stats


async def send_outbox(app: AppT, stats: Stats, task: PartitionTask, records: int) -> None:
    """Send the outbox, and count what it carries: a step's `records`, and those of the
    held steps before it."""
    outbox = task.outbox
    task.writes.to_changelog(outbox)
    task.writes.sent(await send_in_transaction(app, task.tp, outbox.records))
    task.sent = True
    stats.processed(task.tp, outbox.counts, time.time(), records + task.held)
    task.held = 0
    outbox.clear()
