"""What one stage of the pipeline plugs into the exactly-once core. Each agent module
declares its stage once; app/main.py plugs them in (`PartitionTasks.plug_in`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from faust.types import TP

from app.exactly_once.outbox import Record
from app.exactly_once.partition_tasks import PartitionTask


@dataclass(frozen=True, slots=True)
class Stage:
    topic: str  # the input topic its steps consume
    # Its records reach the agent in runs (app/exactly_once/runs.py), not one by one.
    in_runs: bool = False
    # Most records of one run; None: PAIRSTREAM_MAX_RUN_RECORDS.
    run_records: int | None = None
    # Records a partition adds to its transaction just before it commits.
    before_commit: Callable[[PartitionTask], list[Record]] | None = None
    # The topic whose partition task keeps the processor its steps use.
    processor_of: str | None = None
    # Told after each commit which offsets it committed.
    on_commit: Callable[[dict[TP, int]], None] | None = None
    # Awaited on revocation, after the last commit and before the tasks go.
    on_revoke: Callable[[set[TP]], Awaitable[None]] | None = None
    # Its steps hand items to the next stage's partitions here (handoff.py).
    hands_over: bool = False
    # Applies what the stage before hands a partition of this one.
    receive_handed: Callable[[PartitionTask, list[Any]], None] | None = None
