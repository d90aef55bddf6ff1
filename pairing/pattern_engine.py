"""The pattern engine: one declared pattern, matched incrementally over the events of
one key, in event time. Pure: no Faust, no Kafka; state in, state out
(pairing/pattern_state.py). docs/patterns.md has the semantics; tests/pattern_model.py
is their naive model, and the property tests hold this engine to it.

`add` buffers an event; `advance` takes the watermark and processes, in position order
(time, then identity), every buffered event at or before it, deciding what that makes
final. `advance` is `decide` over one key's own state; a partition
(pairing/pattern_partition.py) calls `decide` for each pattern of a key field over the
events they share, and files the key by each one's `deadline`. So the matches depend
on the key's events only, never on their arrival order or on how the input was
partitioned, provided every event at or before a watermark is added before `advance`
is called with it (which is what a watermark promises).

Per event, every partial match either ignores it or takes it into a step that can
(the same step again, or a later one past steps that can take nothing); a new partial
starts with it if the first step takes it. A partial lives until its window closes
(first event time + within): then one waiting on a trailing absent step completes
("not followed by" held to the end of the window), and the rest expire.
"""

from __future__ import annotations

from collections.abc import Iterator

from pairing.pattern_state import (
    Advanced,
    Match,
    Partial,
    PatternEvent,
    PatternState,
    Position,
    Refused,
    buffered,
    due_count,
    key_text,
)
from pairing.patterns import EarlierField, FieldValue, Pattern, Step, compare

Bound = tuple[tuple[int, str, FieldValue], ...]


class PatternEngine:
    """The rules of one pattern, over the state of one key at a time."""

    __slots__ = ("_absent_after", "_max_partials", "_refs", "_rest_empty", "pattern")

    def __init__(self, pattern: Pattern, max_partials: int = 1000) -> None:
        """`max_partials`: the most partial matches one key keeps. When an event would
        leave more, the oldest (earliest first event) are dropped and counted, in
        `Advanced.dropped` and `PatternState.dropped`: they can then never match."""
        if max_partials < 1:
            raise ValueError(f"max_partials must be 1 or more, not {max_partials}")
        self.pattern = pattern
        self._max_partials = max_partials
        self._refs = pattern.referenced()
        steps = pattern.steps
        # Per step: whether every step after it can take nothing (then a partial whose
        # last event is in it is complete once it has taken enough), and whether one of
        # those is absent (then it completes only when its window closes).
        self._rest_empty = tuple(
            all(s.least == 0 for s in steps[i + 1 :]) for i in range(len(steps))
        )
        self._absent_after = tuple(any(s.absent for s in steps[i + 1 :]) for i in range(len(steps)))

    # --- the caller's side: keys, events, the watermark ------------------------

    def key_of(self, event: PatternEvent) -> str | None:
        """The key this pattern files `event` under; None: not matched by this pattern."""
        return key_text(event.fields.get(self.pattern.key))

    def deadline(self, partials: tuple[Partial, ...]) -> int | None:
        """The end of the first window of `partials` to close (in order of `taken`, as
        a state keeps them, so by first event): None, if there are none."""
        return partials[0].first[0] + self.pattern.within_us if partials else None

    def add(self, state: PatternState, event: PatternEvent) -> PatternState | Refused:
        """Buffer `event` until the watermark reaches it. An event at or before the
        watermark the key was last advanced to is refused as late: the matches it could
        have changed are decided. An event is known by its position: a second event
        with a buffered one's time and identity is refused as a duplicate."""
        if self.key_of(event) != state.key:
            raise ValueError(f"event {event.identity!r} is not of key {state.key!r}")
        if state.watermark is not None and event.time <= state.watermark:
            return Refused(event, "late")
        buffer = buffered(state.buffer, event)
        if buffer is None:
            return Refused(event, "duplicate")
        return PatternState(
            state.key, state.watermark, state.last, buffer, state.partials, state.dropped
        )

    def advance(self, state: PatternState, watermark: int) -> Advanced:
        """Process every buffered event at or before `watermark`, in position order, and
        close every window that ends at or before it: what that decides, in order. A
        watermark at or behind the key's changes nothing (watermarks never go back)."""
        if state.watermark is not None and watermark <= state.watermark:
            return Advanced(state, (), 0)
        buffer = state.buffer
        due = due_count(buffer, watermark)
        partials, matches, dropped = self.decide(
            state.partials, buffer[:due], state.last, state.key, watermark
        )
        last = buffer[due - 1].position if due else state.last
        kept = PatternState(
            state.key, watermark, last, buffer[due:], partials, state.dropped + dropped
        )
        return Advanced(kept, matches, dropped)

    def decide(
        self,
        partials: tuple[Partial, ...],
        events: tuple[PatternEvent, ...],
        previous: Position | None,
        key: str,
        watermark: int,
    ) -> tuple[tuple[Partial, ...], tuple[Match, ...], int]:
        """`advance` over the partials of one key: `events`, its buffered events at or
        before `watermark` in position order, `previous` the key's event before them.
        The partials left (in order of `taken`), the matches in the order decided, and
        how many partials the cap dropped."""
        matches: list[Match] = []
        held = list(partials)
        last = previous
        dropped = 0
        first_step = self.pattern.steps[0]
        for event in events:
            if held:
                # Windows that end before this event's time close first: an event at a
                # window's very end still counts in it (within is inclusive).
                held = self._close(held, event.time - 1, key, matches)
            if held or self._holds(first_step, event, ()):
                held, lost = self._process(held, event, last, key, matches)
                dropped += lost
            last = event.position
        if held:
            held = self._close(held, watermark, key, matches)
            held.sort(key=_taken)
        return tuple(held), tuple(matches), dropped

    # --- one event ---------------------------------------------------------------

    def _process(
        self,
        partials: list[Partial],
        event: PatternEvent,
        previous: Position | None,
        key: str,
        matches: list[Match],
    ) -> tuple[list[Partial], int]:
        """Every partial's successors on `event`, the matches it completes, and how many
        partials the cap dropped. `previous`: the key's event before it."""
        here = event.position
        successors: list[Partial] = []
        complete: list[Partial] = []
        started = (
            ()
            if not self._holds(self.pattern.steps[0], event, ())
            else (Partial(((here,),), None, self._bind((), 0, event)),)
        )
        for partial in partials:
            adjacent = partial.last == previous
            for taken in self._takes(partial, event, adjacent):
                self._keep(taken, successors, complete)
            ignored = self._ignore(partial, event)
            if ignored is not None:
                successors.append(ignored)
        for taken in started:
            self._keep(taken, successors, complete)
        if complete:
            complete.sort(key=_taken)
            if self.pattern.skip == "no_skip":
                matches.extend(self._match(p, key, here[0]) for p in complete)
            else:
                # The first to complete, and the least of those that complete at once.
                # Every partial has taken an event up to this one: none goes on.
                matches.append(self._match(complete[0], key, here[0]))
                return [], 0
        if self.pattern.skip == "past_last_event" and len(successors) > 1:
            successors = self._merge(successors, here)
        over = len(successors) - self._max_partials
        if over <= 0:
            return successors, 0
        successors.sort(key=lambda p: (p.first, p.taken))
        return successors[over:], over

    def _keep(self, taken: Partial, successors: list[Partial], complete: list[Partial]) -> None:
        if self._completes(taken):
            complete.append(taken)
        if self._has_future(taken, adjacent=True):
            successors.append(taken)

    def _takes(self, partial: Partial, event: PatternEvent, adjacent: bool) -> Iterator[Partial]:
        """`partial` with `event` taken, by each step that can take it. (Every partial
        here has its window open at the event's time: `_close` saw to it.)"""
        steps = self.pattern.steps
        here = event.position
        at = len(partial.taken) - 1
        current = partial.taken[at]
        step = steps[at]
        if (
            (step.most is None or len(current) < step.most)
            and (step.contiguity == "followed_by" or adjacent)
            and self._holds(step, event, partial.bound)
        ):
            yield Partial((*partial.taken[:at], (*current, here)), None, partial.bound)
        if len(current) < step.least:
            return
        skipped: tuple[tuple[Position, ...], ...] = ()
        for index in range(at + 1, len(steps)):
            later = steps[index]
            if later.absent:
                if partial.blocked == index:
                    return  # an event since the last taken was one this step forbids
            elif (later.contiguity == "followed_by" or adjacent) and self._holds(
                later, event, partial.bound
            ):
                taken = (*partial.taken, *skipped, (here,))
                yield Partial(taken, None, self._bind(partial.bound, index, event))
            if later.least > 0:
                return
            skipped += ((),)

    def _ignore(self, partial: Partial, event: PatternEvent) -> Partial | None:
        """`partial` after `event`, not taken: None if it can no longer complete."""
        steps = self.pattern.steps
        at = len(partial.taken) - 1
        blocked = partial.blocked
        for index in range(at + 1, len(steps) if blocked is None else blocked):
            later = steps[index]
            if later.absent and self._holds(later, event, partial.bound):
                blocked = index
                break
            if later.least > 0:
                break  # the absent steps past it watch from its event on, not from here
        kept = (
            partial
            if blocked == partial.blocked
            else Partial(partial.taken, blocked, partial.bound)
        )
        return kept if self._has_future(kept, adjacent=False) else None

    def _has_future(self, partial: Partial, adjacent: bool) -> bool:
        """Whether `partial` can still complete: it waits for its window to close on a
        trailing absent step, or a step it can reach can take a later event (only a
        relaxed one, unless the next event is `adjacent` to its last)."""
        if self._waits(partial):
            return True
        steps = self.pattern.steps
        at = len(partial.taken) - 1
        count = len(partial.taken[at])
        step = steps[at]
        if (step.most is None or count < step.most) and (
            adjacent or step.contiguity == "followed_by"
        ):
            return True
        if count < step.least:
            return False
        for index in range(at + 1, len(steps)):
            later = steps[index]
            if later.absent:
                if partial.blocked == index:
                    return False
                continue
            if adjacent or later.contiguity == "followed_by":
                return True
            if later.least > 0:
                return False
        return False

    def _completes(self, partial: Partial) -> bool:
        """Complete at its last event: enough taken, and every later step takes nothing
        and none of them is absent."""
        at = len(partial.taken) - 1
        return (
            len(partial.taken[at]) >= self.pattern.steps[at].least
            and self._rest_empty[at]
            and not self._absent_after[at]
        )

    def _waits(self, partial: Partial) -> bool:
        """Complete but for trailing absent steps: it completes when its window closes,
        if no event satisfies one of them by then."""
        at = len(partial.taken) - 1
        return (
            partial.blocked is None
            and len(partial.taken[at]) >= self.pattern.steps[at].least
            and self._rest_empty[at]
            and self._absent_after[at]
        )

    def _merge(self, partials: list[Partial], here: Position) -> list[Partial]:
        """Past last event keeps, of partials with the same future, only the least.

        Two partials whose last events are in the same step, with the same count there,
        the same first event, the same adjacency to the next event, the same block and
        the same bound fields take the same later events to the same ends; and their
        extensions compare as they do (the steps before are fixed, and the current one's
        tuples have one length). So the greater could only ever complete alongside the
        lesser, and would never be the one emitted. Without this, `at_least` over a
        relaxed stream keeps a partial per subset of its events."""
        least: dict[tuple[object, ...], Partial] = {}
        for partial in partials:
            same = (
                len(partial.taken),
                len(partial.taken[-1]),
                partial.first,
                partial.last == here,
                partial.blocked,
                partial.bound,
            )
            known = least.get(same)
            if known is None or partial.taken < known.taken:
                least[same] = partial
        return list(least.values())

    # --- windows closing ---------------------------------------------------------

    def _close(
        self, partials: list[Partial], upto: int, key: str, matches: list[Match]
    ) -> list[Partial]:
        """Close every window that ends at or before `upto`: a partial waiting on
        trailing absent steps completes (in order of deadline, then of `taken`), the
        others expire. Past last event: each match emitted removes every partial that
        starts at or before its last event."""
        within = self.pattern.within_us
        if not partials or all(p.first[0] + within > upto for p in partials):
            return partials
        due = sorted(
            (p for p in partials if p.first[0] + within <= upto and self._waits(p)),
            key=lambda p: (p.first[0], p.taken),
        )
        after: Position | None = None
        for partial in due:
            if self.pattern.skip == "past_last_event":
                if after is not None and partial.first <= after:
                    continue
                after = partial.last
            matches.append(self._match(partial, key, partial.first[0] + within))
        return [
            p for p in partials if p.first[0] + within > upto and (after is None or p.first > after)
        ]

    # --- helpers -----------------------------------------------------------------

    def _holds(self, step: Step, event: PatternEvent, bound: Bound) -> bool:
        fields = event.fields
        for condition in step.where:
            operand = condition.operand
            if isinstance(operand, EarlierField):
                # A step that took no event (optional) binds nothing: the comparison fails.
                right = next(
                    (v for s, name, v in bound if s == operand.step and name == operand.field),
                    None,
                )
            else:
                right = operand
            if not compare(fields.get(condition.field), condition.op, right):
                return False
        return True

    def _bind(self, bound: Bound, step: int, event: PatternEvent) -> Bound:
        """`bound` with what later conditions read of `event`, when it is the first
        event of `step`."""
        names = self._refs.get(step)
        if not names:
            return bound
        return (*bound, *((step, name, event.fields.get(name)) for name in names))

    def _match(self, partial: Partial, key: str, completed_at: int) -> Match:
        taken = partial.taken
        events = tuple(tuple(identity for _, identity in step) for step in taken)
        events += ((),) * (len(self.pattern.steps) - len(taken))
        return Match(
            self.pattern.name, key, events, partial.first[0], partial.last[0], completed_at
        )


def _taken(partial: Partial) -> tuple[tuple[Position, ...], ...]:
    return partial.taken
