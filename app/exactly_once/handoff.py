"""The hand-off: what a step of one stage gives a partition task of the next stage on this
worker directly, instead of writing it to that stage's topic and reading it back (ingest's
events whose keyed partition this worker pairs). It saves the second transaction: what
ingest hands over is paired in the same transaction that commits its input offset.

Exactly-once: handed items wait in memory, per receiving partition, in the order handed.
The receiving task applies them in a step of its own (handed_steps.py, under its
lock) soon after, and a commit applies what is left before its transaction ends, so
the transaction that commits a giving step's offset carries what its items caused. A
crash loses the items with the transaction, which aborts: the input is processed again.

Order: a receiving partition must see each source's records in the source's order.
Records a source's earlier owners wrote to the topic come before anything handed, so the
hand-off to a partition opens only once the partition has read a fence record written
after the assignment (`fence_due`, `fenced`); until every receiving partition here is
open, the giving stages' partitions stay paused (consumer.py, `when_open`). The one
record sent to the topic outside that order is a source's idle claim (ingest's timer,
outside any transaction): one read after the source handed something newer is stale and
skipped (`claimed_idle`, `stale_claim`).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from faust.types import TP

if TYPE_CHECKING:  # the registry of partition tasks keeps the hand-off
    from app.exactly_once.partition_tasks import PartitionTask

FENCE_KEY = b"~handoff"
Handler = Callable[["PartitionTask", list[Any]], None]


class Handoff:
    """Items handed to each receiving partition of this worker, and whether its hand-off
    is open. One per worker (`PartitionTasks.handoff`), reset at every assignment."""

    def __init__(self) -> None:
        self.handlers: dict[str, Handler] = {}  # receiving topic -> what applies its items
        self.giving: set[str] = set()  # topics whose steps hand items over
        self._waiting: dict[TP, list[Any]] = {}
        self._receivers: set[TP] = set()  # assigned partitions of receiving topics
        self._open: set[TP] = set()
        self._token = b""
        self.due = asyncio.Event()  # items wait
        self._on_open: list[Callable[[], None]] = []
        # Per source (a giving partition): its hand-offs so far, counted once a step; and
        # per receiving partition and source, that count at each idle claim in flight.
        self._hands: dict[int, int] = {}
        self._claims: dict[tuple[TP, int], list[int]] = {}

    def receives(self, topic: str, handler: Handler) -> None:
        self.handlers[topic] = handler

    def gives(self, topic: str) -> None:
        self.giving.add(topic)

    def when_open(self, callback: Callable[[], None]) -> None:
        """Call `callback` each time every receiving partition has become open."""
        self._on_open.append(callback)

    def assigned(self, tps: Iterable[TP]) -> None:
        """A new assignment: every receiving partition closed until it reads a new fence."""
        self._waiting.clear()
        self._hands.clear()
        self._claims.clear()
        self._receivers = {tp for tp in tps if tp.topic in self.handlers}
        self._token = uuid.uuid4().hex.encode()
        self._open.clear()
        if self.all_open():
            self._opened()

    def revoked(self, tps: Iterable[TP]) -> None:
        # Whatever still waits belongs to steps whose transaction did not commit.
        for tp in tps:
            self._waiting.pop(tp, None)
            self._receivers.discard(tp)
            self._open.discard(tp)

    def is_open(self, tp: TP) -> bool:
        return tp in self._open

    def all_open(self) -> bool:
        return self._receivers <= self._open

    def fence_due(self) -> tuple[bytes, list[TP]]:
        """The fence to write to each receiving partition not open yet."""
        return self._token, sorted(self._receivers - self._open)

    def fenced(self, tp: TP, token: bytes) -> None:
        """`tp` read a fence record: open if it is this assignment's."""
        if token == self._token and tp in self._receivers and tp not in self._open:
            self._open.add(tp)
            if self.all_open():
                self._opened()

    def handed_by(self, source: int) -> None:
        """A step of `source` handed something over."""
        self._hands[source] = self._hands.get(source, 0) + 1

    def claimed_idle(self, source: int) -> None:
        """`source` is about to claim idleness to every receiving partition, through the
        topic."""
        hands = self._hands.get(source, 0)
        for tp in self._receivers:
            self._claims.setdefault((tp, source), []).append(hands)

    def stale_claim(self, tp: TP, source: int) -> bool:
        """Whether the idle claim of `source` that `tp` reads now was overtaken by what
        the source handed it since: the source was not idle any more. Claims reach a
        partition in the order sent; a lost one only makes a later one count as stale."""
        sent = self._claims.get((tp, source))
        if not sent:
            return False  # sent before this assignment: read before anything handed
        return sent.pop(0) != self._hands.get(source, 0)

    def hand(self, tp: TP, item: Any) -> None:
        waiting = self._waiting.get(tp)
        if waiting is None:
            waiting = self._waiting[tp] = []
        waiting.append(item)
        self.due.set()

    def take(self, tp: TP) -> list[Any]:
        return self._waiting.pop(tp, [])

    def waiting(self) -> list[TP]:
        return sorted(self._waiting)

    def _opened(self) -> None:
        for callback in self._on_open:
            callback()
