"""A deliberately naive model of pattern matching (docs/patterns.md), the spec the
engine (pairing/pattern_engine.py) is held to.

For each key it takes the key's whole stream at once, ordered by (time, identity),
tries every assignment of its events to the pattern's steps, keeps those that satisfy
every rule as the reference states it (`is_match`), and lets the skip strategy choose
among them. No buffer, no partial matches, no watermark, nothing incremental; its only
shortcut is in `candidates`, which offers a step only events inside the window that
satisfy the step's own conditions (which `is_match` checks again).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from decimal import Decimal
from itertools import combinations, pairwise

from pairing.pattern_state import Match, PatternEvent, Position, key_text
from pairing.patterns import COMPARE, EarlierField, FieldValue, Pattern, Step

Assignment = tuple[tuple[int, ...], ...]  # per step, indices into the key's ordered events
Completion = tuple[int, int, str]  # (time, 0: at an event / 1: after every event of then, identity)


def expected_matches(pattern: Pattern, events: Iterable[PatternEvent]) -> list[Match]:
    """Every match the pattern makes over `events` (any order, any keys), key by key,
    each key's in the order decided."""
    by_key: dict[str, dict[Position, PatternEvent]] = {}
    for event in events:
        key = key_text(event.fields.get(pattern.key))
        if key is not None:
            by_key.setdefault(key, {}).setdefault(event.position, event)
    found: list[Match] = []
    for key, at in sorted(by_key.items()):
        ordered = [at[position] for position in sorted(at)]
        matches = sorted(
            (completion(pattern, ordered, a), a)
            for a in candidates(pattern, ordered)
            if is_match(pattern, ordered, a)
        )
        if pattern.skip == "past_last_event":
            matches = past_last_event(matches)
        found += [_match(pattern, key, ordered, a, done) for done, a in matches]
    return found


def is_match(pattern: Pattern, events: list[PatternEvent], a: Assignment) -> bool:
    """Whether assignment `a` of the key's ordered `events` is a match."""
    flat = [x for taken in a for x in taken]
    if not flat or any(x >= y for x, y in pairwise(flat)):
        return False  # at least one event, in the key's order, none twice
    first, last = events[flat[0]], events[flat[-1]]
    if last.time - first.time > pattern.within_us:
        return False
    for i, step in enumerate(pattern.steps):
        taken = a[i]
        if step.absent and taken:
            return False
        if len(taken) < step.least or (step.most is not None and len(taken) > step.most):
            return False
        if not all(satisfies(step, events[x], events, a) for x in taken):
            return False
        if step.contiguity == "next":
            for m, x in enumerate(taken):
                # The key's very next event after the previous matched one.
                before = taken[m - 1] if m else last_before(a, i)
                if before is not None and x != before + 1:
                    return False
    for i, step in enumerate(pattern.steps):
        if not step.absent:
            continue
        start = last_before(a, i)
        end = first_after(a, i)
        assert start is not None  # the first step takes an event
        for r in range(start + 1, len(events) if end is None else end):
            if end is None and events[r].time > first.time + pattern.within_us:
                break  # nothing later followed in time: up to the window's end, inclusive
            if satisfies(step, events[r], events, a):
                return False
    return True


def completion(pattern: Pattern, events: list[PatternEvent], a: Assignment) -> Completion:
    """When a match is complete: at its last event; or, when an absent step has no
    matched event after it, once every event up to the end of its window is known."""
    flat = [x for taken in a for x in taken]
    if any(step.absent and first_after(a, i) is None for i, step in enumerate(pattern.steps)):
        return (events[flat[0]].time + pattern.within_us, 1, "")
    last = events[flat[-1]]
    return (last.time, 0, last.identity)


def past_last_event(
    matches: list[tuple[Completion, Assignment]],
) -> list[tuple[Completion, Assignment]]:
    """Repeatedly: of the matches using only events after the last emitted one's last
    event, the one that completes first (then the least tuple of positions)."""
    chosen = []
    after = -1
    while True:
        left = [(done, a) for done, a in matches if _flat(a)[0] > after]
        if not left:
            return chosen
        best = min(left)  # (completion, assignment): positions are indices in order
        chosen.append(best)
        after = _flat(best[1])[-1]


def candidates(pattern: Pattern, events: list[PatternEvent]) -> Iterator[Assignment]:
    """Assignments of events to steps in order, each step offered only the events in the
    first event's window that satisfy its own conditions: a superset of the matches."""
    steps = pattern.steps

    def extend(i: int, chosen: list[tuple[int, ...]], after: int) -> Iterator[Assignment]:
        if i == len(steps):
            yield tuple(chosen)
            return
        step = steps[i]
        fits = [
            x
            for x in range(after + 1, len(events))
            if satisfies(step, events[x], events, chosen)
            and (not chosen or events[x].time - events[chosen[0][0]].time <= pattern.within_us)
        ]
        most = len(fits) if step.most is None else min(step.most, len(fits))
        for count in range(step.least, most + 1):
            for combo in combinations(fits, count):
                if i == 0 and events[combo[-1]].time - events[combo[0]].time > pattern.within_us:
                    continue
                yield from extend(i + 1, [*chosen, combo], combo[-1] if combo else after)

    yield from extend(0, [], -1)


def satisfies(
    step: Step, event: PatternEvent, events: list[PatternEvent], a: Iterable[tuple[int, ...]]
) -> bool:
    """Every condition of `step` holds of `event`; a field of an earlier step is that
    of its first matched event, and missing if it matched none."""
    taken = list(a)
    for condition in step.where:
        operand = condition.operand
        right: FieldValue
        if isinstance(operand, EarlierField):
            earlier = taken[operand.step]
            right = events[earlier[0]].fields.get(operand.field) if earlier else None
        else:
            right = operand
        if not _compare(event.fields.get(condition.field), condition.op, right):
            return False
    return True


def _compare(left: FieldValue, op: str, right: FieldValue) -> bool:
    numbers = (int, Decimal)
    both_text = isinstance(left, str) and isinstance(right, str)
    both_numbers = isinstance(left, numbers) and isinstance(right, numbers)
    return (both_text or both_numbers) and COMPARE[op](left, right)


def last_before(a: Assignment | list[tuple[int, ...]], i: int) -> int | None:
    earlier = [x for taken in a[:i] for x in taken]
    return earlier[-1] if earlier else None


def first_after(a: Assignment, i: int) -> int | None:
    later = [x for taken in a[i + 1 :] for x in taken]
    return later[0] if later else None


def _flat(a: Assignment) -> list[int]:
    return [x for taken in a for x in taken]


def _match(
    pattern: Pattern, key: str, events: list[PatternEvent], a: Assignment, done: Completion
) -> Match:
    flat = _flat(a)
    return Match(
        pattern.name,
        key,
        tuple(tuple(events[x].identity for x in taken) for taken in a),
        events[flat[0]].time,
        events[flat[-1]].time,
        done[0],
    )
