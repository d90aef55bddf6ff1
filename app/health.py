"""Whether a worker is ready for work, and whether it is alive: the rules /ready and
/live answer by (web/probes.py reads the facts off the app and the broker).

Ready: in its consumer group, not rebalancing, its tables restored, its stages running
and records flowing to them. Alive: no partition has had committed records to read
while its next offset to process stood still for PAIRSTREAM_STUCK_SECONDS. A worker
that is not ready is not judged alive or not: a long restore is a startup probe's to
wait for (docs/deploy.md, "Probes").
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass

from faust.types import TP


@dataclass(frozen=True, slots=True)
class WorkerFacts:
    generation: int  # of the consumer group; -1 until the worker first joined it
    rebalancing: bool
    restoring: bool  # tables of the current assignment not yet restored
    flowing: bool  # records are handed to the stages (faust's flow is not suspended)
    stopped_stages: tuple[str, ...]  # agents that are not running


def not_ready(facts: WorkerFacts) -> list[str]:
    """Why the worker is not ready; empty when it is."""
    reasons = []
    if facts.generation < 0:
        reasons.append("not in its consumer group yet")
    if facts.rebalancing:
        reasons.append("rebalancing")
    if facts.restoring:
        reasons.append("restoring its tables")
    if not facts.flowing:
        reasons.append("records are not flowing to its stages")
    if facts.stopped_stages:
        reasons.append(f"stages not running: {', '.join(facts.stopped_stages)}")
    return reasons


class ProgressWatch:
    """Per partition, since when it has had records to read with its next offset to
    process standing still. Looked at by each /live request: no per-event work."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        # Partition -> its next offset at the last look, and since when it has waited
        # (None: it had nothing to read, or moved, at the last look).
        self._seen: dict[TP, tuple[int, float | None]] = {}

    def standing(self, offsets: Mapping[TP, int]) -> dict[TP, int]:
        """The partitions whose next offset is where it was at the last look: those
        whose records to read, if any, have not moved it."""
        return {
            tp: offset
            for tp, offset in offsets.items()
            if (seen := self._seen.get(tp)) is not None and seen[0] == offset
        }

    def look(self, offsets: Mapping[TP, int], unread: Set[TP], now: float) -> dict[TP, float]:
        """Record this look (`unread`: the standing partitions with committed records at
        or after their next offset) and return how long each waiting partition has
        waited, in seconds of the clock `now` is on."""
        waited: dict[TP, float] = {}
        seen: dict[TP, tuple[int, float | None]] = {}
        for tp, offset in offsets.items():
            before = self._seen.get(tp)
            since = None
            if tp in unread and before is not None and before[0] == offset:
                since = now if before[1] is None else before[1]
                waited[tp] = now - since
            seen[tp] = (offset, since)
        self._seen = seen  # partitions no longer assigned are forgotten
        return waited

    def forget(self) -> None:
        """A worker that is not ready starts over: its partitions may change meanwhile."""
        self._seen = {}


def stuck(waited: Mapping[TP, float], limit: float) -> list[str]:
    """The partitions that have waited `limit` seconds or more, as `topic[p] for N s`."""
    return [
        f"{tp.topic}[{tp.partition}] for {seconds:.0f} s"
        for tp, seconds in sorted(waited.items())
        if seconds >= limit
    ]
