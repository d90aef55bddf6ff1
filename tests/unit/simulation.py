"""The pipeline in one process, with every order of events the real one allows.

Ingest of each input partition stamps its events with the partition's progress and
tells every keyed partition of it (at once when newly assigned, then with a commit at
most once per `TELL_EVERY`, and what is left untold once caught up), as
`agents.ingest` does; each keyed partition runs the rule engine over what reaches it.
Between a source and a keyed partition records stay in order; all else (which
partition is read next, when a source commits, when a component restarts from its
stored state) is drawn from `rng`.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable

from pairing.events import Event, Rejection
from pairing.key_state import Conflict, Duplicate, Outcome, Paired, PairingConfig, Unpaired
from pairing.records import decode_clock, encode_clock
from pairing.routing import partition_for
from pairing.rules import PairingPartition
from pairing.watermarks import EventClock, SourceProgress, WatermarkUpdate
from tests.reference_model import Expected, Reading
from tests.unit.memory_store import MemoryStore

Item = WatermarkUpdate | tuple[Event, int]
TELL_EVERY = 0.02  # wall clock: 20 actions, most commits tell nothing
ClockFactory = Callable[[EventClock], EventClock]


def tally(outcomes: list[Outcome], out: Expected) -> None:
    for outcome in outcomes:
        if isinstance(outcome, Paired):
            key = (outcome.key, outcome.a.identity, outcome.b.identity, str(outcome.sum))
            out.pairs[key] += 1
        elif isinstance(outcome, Unpaired):
            e = outcome.event
            out.unpaired[(outcome.key, e.type, e.identity, outcome.reason)] += 1
        elif isinstance(outcome, Conflict):
            out.conflicts[outcome.event.identity] += 1
        elif isinstance(outcome, Duplicate):
            out.duplicates += 1


class Simulation:
    def __init__(
        self,
        sources: list[list[bytes | None]],
        keyed_partitions: int,
        config: PairingConfig,
        rng: random.Random,
        clock: ClockFactory = lambda restored: restored,
        restarts: float = 0.05,
        end_idle: bool = False,
        reading: Reading | None = None,
    ) -> None:
        self.sources = sources
        self.read_event = (reading or Reading()).read
        self.partitions = keyed_partitions
        self.config = config
        self.rng = rng
        self.clock = clock
        self.restarts = restarts
        self.end_idle = end_idle  # every source declared idle once all is read and told
        self.declared_idle: set[int] = set()
        self.now = 0.0
        self.out = Expected()
        self.read = [0] * len(sources)
        self.progress = [SourceProgress(None, self.now) for _ in sources]
        self.uncommitted = [False] * len(sources)  # records read since the last commit
        self.channels = {
            (q, k): deque[Item]() for q in range(len(sources)) for k in range(keyed_partitions)
        }
        self.stores = [MemoryStore() for _ in range(keyed_partitions)]
        self.engines = [
            PairingPartition(store, config, clock(EventClock()), self.now) for store in self.stores
        ]

    def run(self) -> Expected:
        """Until every record is read, every progress told and every channel empty."""
        actions = [
            self._ingest_one,
            self._commit_one,
            self._consume_one,
            self._restart_one,
            self._idle_one,
            self._tell_caught_up_one,
        ]
        weights = [4, 1, 4, self.restarts, 1, 1]
        while self._busy():
            self.now += 0.001  # wall clock, far from max wait: it never expires anything
            self.rng.choices(actions, weights)[0]()
        return self.out

    def _busy(self) -> bool:
        return (
            any(self.read[q] < len(records) for q, records in enumerate(self.sources))
            or any(self.uncommitted)
            or any(self.channels.values())
            or len(self._may_go_idle()) > 0
            or len(self._caught_up_untold()) > 0
        )

    def _caught_up(self, q: int) -> bool:
        return self.read[q] == len(self.sources[q]) and not self.uncommitted[q]

    def _caught_up_untold(self) -> list[int]:
        return [
            q
            for q in range(len(self.sources))
            if self._caught_up(q) and not self.progress[q].idle and self.progress[q].untold()
        ]

    def _may_go_idle(self) -> list[int]:
        """Sources caught up with nothing untold: those without a valid event at any
        time (a never-written partition goes idle once its timeout has passed, at no
        particular point of the others' streams), the others only at the end with
        `end_idle`."""
        sources = range(len(self.sources))
        done = [q for q in sources if self._caught_up(q) and q not in self.declared_idle]
        everything_told = all(self._caught_up(q) for q in sources)
        return [
            q
            for q in done
            if self.progress[q].progress_us is None or (self.end_idle and everything_told)
        ]

    def _idle_one(self) -> None:
        candidates = self._may_go_idle()
        if not candidates:
            return
        q = self.rng.choice(candidates)
        self.declared_idle.add(q)
        self.progress[q].went_idle()
        update = self.progress[q].update(q, len(self.sources))
        for k in range(self.partitions):
            self.channels[(q, k)].append(update)

    def _ingest_one(self) -> None:
        waiting = [q for q, records in enumerate(self.sources) if self.read[q] < len(records)]
        if not waiting:
            return
        q = self.rng.choice(waiting)
        raw = self.sources[q][self.read[q]]
        self.read[q] += 1
        self.uncommitted[q] = True
        parsed = self.read_event(raw)
        if isinstance(parsed, Rejection):
            self.out.invalid[raw] += 1
            return
        progress = self.progress[q]
        stamp = progress.observe(parsed.time_us, self.now)
        if progress.must_announce:
            self._tell(q)
        self.channels[(q, partition_for(parsed.key, self.partitions))].append((parsed, stamp))

    def _commit_one(self) -> None:
        """A commit of a source that read something since the last one."""
        q = self.rng.randrange(len(self.sources))
        if self.uncommitted[q] and self.progress[q].tell_due(self.now, TELL_EVERY):
            self._tell(q)
        self.uncommitted[q] = False

    def _tell_caught_up_one(self) -> None:
        """A caught-up source tells what its commits left untold, outside a transaction."""
        untold = self._caught_up_untold()
        due = [q for q in untold if self.progress[q].tell_due(self.now, TELL_EVERY)]
        if due:
            self._tell(self.rng.choice(due))

    def _tell(self, q: int) -> None:
        update = self.progress[q].announcement(q, len(self.sources), self.now)
        for k in range(self.partitions):
            self.channels[(q, k)].append(update)

    def _consume_one(self) -> None:
        ready = [qk for qk, channel in self.channels.items() if channel]
        if not ready:
            return
        q, k = self.rng.choice(ready)
        item = self.channels[(q, k)].popleft()
        engine = self.engines[k]
        if isinstance(item, WatermarkUpdate):
            tally(engine.observe(item, self.now), self.out)
        else:
            event, stamp = item
            tally(engine.process(event, stamp, self.now), self.out)

    def _restart_one(self) -> None:
        """A component starts again from what it stored (its committed state)."""
        if self.rng.random() < 0.5:
            q = self.rng.randrange(len(self.sources))
            self.progress[q] = SourceProgress(self.progress[q].progress_us, self.now)
            # It has forgotten that it declared the source idle: it tells the source's
            # progress as not idle, and declares it idle again after the timeout.
            self.declared_idle.discard(q)
        else:
            k = self.rng.randrange(self.partitions)
            restored = decode_clock(encode_clock(self.engines[k].clock))
            self.engines[k] = PairingPartition.load(
                self.stores[k], self.config, self.clock(restored), self.now
            )

    def drain(self) -> Expected:
        """What max wait does to a quiet stream: every open key closes."""
        for engine in self.engines:
            tally(engine.expire_waiting(self.now + 10 * self.config.max_wait_s), self.out)
        return self.out

    def pending(self) -> set[str]:
        return {
            s.pending.identity for store in self.stores for s in store.data.values() if s.pending
        }

    def held_late(self) -> set[str]:
        return {
            late.identity for store in self.stores for s in store.data.values() for late in s.late
        }
