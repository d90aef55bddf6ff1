"""Sequence patterns over a key's events (complex event processing): the declarations,
read from a TOML file, and the one comparison their conditions make. Pure: no Faust, no
Kafka. pairing/pattern_engine.py matches them; docs/patterns.md is the reference.

Declared in a file rather than through a Python API, because:
  * operators change patterns without a release: the file is configuration, not code;
  * the worker reads and validates every pattern when it starts, and refuses a bad file
    with one message naming the pattern, the step and the field, instead of failing on
    the first event that reaches a broken condition;
  * a pattern is plain data (tables of strings and numbers), so the property tests draw
    random ones as data and put them through the same validator the worker uses.

A pattern's steps are stored with their quantifier as bounds: `times = n` is n..n,
`at_least = n` is n..unbounded, `optional` is 0..1, and an absent step is 0..0.
"""

from __future__ import annotations

import operator
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal, get_args

Op = Literal["==", "!=", "<", "<=", ">", ">="]
Contiguity = Literal["followed_by", "next"]
Skip = Literal["past_last_event", "no_skip"]
Value = str | int | Decimal  # a constant in a condition
FieldValue = str | int | Decimal | None  # an event's field; None: JSON null

OPS: tuple[Op, ...] = get_args(Op)
MAX_STEPS = 8
# A partial match keeps the position of every event it took: a bound on any one step's
# count bounds the size of a partial match (and of the state per key).
MAX_COUNT = 100
MICROS = 1_000_000
# Pattern names will name topics (one per pattern): Kafka's characters for topic names.
_NAME = re.compile(r"[A-Za-z0-9._-]{1,100}")
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")  # Kafka's rule for a topic's name

COMPARE: dict[Op, Callable[[Any, Any], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def compare(left: FieldValue, op: Op, right: FieldValue) -> bool:
    """`left op right`, or False when either side is missing (None) or the two are not
    both text or both numbers: a condition on data that is not there, or not of the
    kind it speaks of, does not hold, whichever the operator (`!=` too). Never raises."""
    if left is None or right is None:
        return False
    if isinstance(left, str) != isinstance(right, str):
        return False
    # A NaN compares with nothing (Decimal raises on `<`); the grammar refuses NaN, but
    # fields may come from other readers later.
    if isinstance(left, Decimal) and left.is_nan():
        return False
    if isinstance(right, Decimal) and right.is_nan():
        return False
    return COMPARE[op](left, right)


@dataclass(frozen=True, slots=True)
class EarlierField:
    """A field of the first event an earlier step matched."""

    step: int  # index of that step in the pattern
    field: str


@dataclass(frozen=True, slots=True)
class Condition:
    field: str  # of the event being matched
    op: Op
    operand: Value | EarlierField


@dataclass(frozen=True, slots=True)
class Step:
    name: str
    where: tuple[Condition, ...] = ()  # all must hold; none: any event
    contiguity: Contiguity = "followed_by"
    least: int = 1  # fewest events the step takes
    most: int | None = 1  # most; None: no bound (`at_least`)
    absent: bool = False  # "not followed by": takes no event, and none may satisfy `where`


@dataclass(frozen=True, slots=True)
class Pattern:
    name: str
    key: str  # the field whose value partitions events; events without it are not matched
    within_us: int  # last event time - first event time <= within
    steps: tuple[Step, ...]
    skip: Skip = "past_last_event"

    def referenced(self) -> dict[int, tuple[str, ...]]:
        """For each step whose first event a later condition reads: the fields read."""
        fields: dict[int, set[str]] = {}
        for step in self.steps:
            for condition in step.where:
                if isinstance(condition.operand, EarlierField):
                    earlier = condition.operand
                    fields.setdefault(earlier.step, set()).add(earlier.field)
        return {index: tuple(sorted(names)) for index, names in sorted(fields.items())}


@dataclass(frozen=True, slots=True)
class PatternInput:
    """What a pattern file matches: JSON records of its topics, read as one stream."""

    topics: tuple[str, ...]
    time: str = "timestamp"  # the field of an event's time (the grammar's timestamps)
    identity: str = "id"  # the field that tells events apart; unique across the topics
    topic_field: str | None = None  # a field set to the record's topic (None: none)


@dataclass(frozen=True, slots=True)
class PatternFile:
    input: PatternInput | None  # None: not declared (a worker refuses such a file)
    patterns: tuple[Pattern, ...]

    def fields(self) -> frozenset[str]:
        """The event fields any pattern reads (keys and conditions): an event keeps only
        these, so state holds nothing that no condition looks at."""
        read = {pattern.key for pattern in self.patterns}
        for pattern in self.patterns:
            for step in pattern.steps:
                for condition in step.where:
                    read.add(condition.field)
                    if isinstance(condition.operand, EarlierField):
                        read.add(condition.operand.field)
        return frozenset(read)


class PatternError(ValueError):
    """A pattern file the worker refuses, with the one thing wrong and where it is."""


def load_patterns(path: Path) -> PatternFile:
    """A worker's pattern file: its input and every pattern, validated; PatternError
    naming the first fault."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PatternError(f"{path}: cannot be read: {exc}") from exc
    declared = parse_patterns(text, str(path))
    if declared.input is None:
        raise PatternError(f"{path}: declares no [input]: expected its topics, e.g. topics = [...]")
    return declared


def parse_patterns(text: str, source: str = "patterns") -> PatternFile:
    try:
        # Decimal, not float: a constant 0.1 is the number 0.1, as event values are.
        doc = tomllib.loads(text, parse_float=Decimal)
    except tomllib.TOMLDecodeError as exc:
        raise PatternError(f"{source}: not valid TOML: {exc}") from exc
    _only(doc, {"input", "pattern"}, source)
    declared = doc.get("pattern")
    if not isinstance(declared, list) or not declared:
        raise PatternError(f"{source}: declares no pattern: expected [[pattern]] tables")
    patterns: list[Pattern] = []
    for index, entry in enumerate(declared):
        pattern = parse_pattern(entry, source, index + 1)
        if any(p.name == pattern.name for p in patterns):
            raise PatternError(f"{source}: pattern {pattern.name!r}: name used twice")
        patterns.append(pattern)
    return PatternFile(_input(doc["input"], source) if "input" in doc else None, tuple(patterns))


def _input(doc: Any, source: str) -> PatternInput:
    at = f"{source}: input"
    if not isinstance(doc, dict):
        raise PatternError(f"{at}: expected a table")
    _only(doc, {"topics", "time", "identity", "topic_field"}, at)
    topics = doc.get("topics")
    if not isinstance(topics, list) or not topics:
        raise PatternError(f"{at}: topics: expected a list of topic names, got {_shown(topics)}")
    for number, topic in enumerate(topics, 1):
        if not isinstance(topic, str) or not _TOPIC.fullmatch(topic) or topic in {".", ".."}:
            expected = "1 to 249 of A-Z a-z 0-9 . _ -"
            raise PatternError(f"{at}: topics[{number}]: expected {expected}, got {_shown(topic)}")
    if len(set(topics)) != len(topics):
        raise PatternError(f"{at}: topics: a topic named twice")
    defaults: dict[str, str | None] = {"time": "timestamp", "identity": "id", "topic_field": None}
    fields: dict[str, Any] = {word: doc.get(word, default) for word, default in defaults.items()}
    for word, field in fields.items():
        if field is not None and (not isinstance(field, str) or not field):
            raise PatternError(f"{at}: {word}: expected the name of a field, got {_shown(field)}")
    named = [field for field in fields.values() if field is not None]
    if len(set(named)) != len(named):
        raise PatternError(f"{at}: time, identity and topic_field: one field for two of them")
    return PatternInput(tuple(topics), fields["time"], fields["identity"], fields["topic_field"])


def parse_pattern(doc: Any, source: str = "patterns", number: int = 1) -> Pattern:
    """One pattern from its table: the `number`th [[pattern]] of the file `source`, or
    the same data built by a test."""
    if not isinstance(doc, dict):
        raise PatternError(f"{source}: pattern #{number}: expected a table")
    name = _name(doc, "name", f"{source}: pattern #{number}")
    at = f"{source}: pattern {name!r}"
    _only(doc, {"name", "key", "within", "skip", "step"}, at)
    key = doc.get("key")
    if not isinstance(key, str) or not key:
        raise PatternError(f"{at}: key: expected the name of a field, got {_shown(key)}")
    within_us = _within(doc.get("within"), at)
    skip = doc.get("skip", "past_last_event")
    if skip not in get_args(Skip):
        raise PatternError(
            f"{at}: skip: expected 'past_last_event' or 'no_skip', got {_shown(skip)}"
        )
    declared = doc.get("step")
    if not isinstance(declared, list) or not 1 <= len(declared) <= MAX_STEPS:
        count = len(declared) if isinstance(declared, list) else 0
        raise PatternError(f"{at}: expected 1 to {MAX_STEPS} [[pattern.step]] tables, got {count}")
    steps: list[Step] = []
    for index, entry in enumerate(declared):
        steps.append(_step(entry, index, steps, at))
    return Pattern(name, key, within_us, tuple(steps), skip)


def _step(doc: Any, index: int, earlier: list[Step], at: str) -> Step:
    if not isinstance(doc, dict):
        raise PatternError(f"{at}: step #{index + 1}: expected a table")
    name = _name(doc, "name", f"{at}: step #{index + 1}")
    here = f"{at}, step {name!r}"
    if any(step.name == name for step in earlier):
        raise PatternError(f"{here}: name used twice")
    _only(doc, {"name", "where", "contiguity", "times", "at_least", "optional", "absent"}, here)
    contiguity = doc.get("contiguity", "followed_by")
    if contiguity not in get_args(Contiguity):
        raise PatternError(
            f"{here}: contiguity: expected 'followed_by' or 'next', got {_shown(contiguity)}"
        )
    absent = _flag(doc, "absent", here)
    least, most = _quantifier(doc, here)
    if absent and any(word in doc for word in ("times", "at_least", "optional")):
        raise PatternError(f"{here}: an absent step takes no times, at_least or optional")
    if absent and contiguity == "next":
        raise PatternError(f"{here}: an absent step takes no contiguity ('next' is not supported)")
    if index == 0 and (absent or least == 0):
        raise PatternError(
            f"{here}: the first step must take an event: it may not be absent or optional"
        )
    where = doc.get("where", [])
    if not isinstance(where, list):
        raise PatternError(f"{here}: where: expected a list of conditions")
    conditions = tuple(_condition(c, f"{here}, where[{n}]", earlier) for n, c in enumerate(where))
    if absent:
        least, most = 0, 0
    return Step(name, conditions, contiguity, least, most, absent)


def _quantifier(doc: dict[str, Any], here: str) -> tuple[int, int | None]:
    given = [word for word in ("times", "at_least", "optional") if word in doc]
    if len(given) > 1:
        raise PatternError(f"{here}: {' and '.join(given)}: at most one quantifier per step")
    if "optional" in doc:
        return (0, 1) if _flag(doc, "optional", here) else (1, 1)
    for word in ("times", "at_least"):
        if word in doc:
            count = doc[word]
            if isinstance(count, bool) or not isinstance(count, int):
                raise PatternError(f"{here}: {word}: expected a whole number, got {_shown(count)}")
            if not 1 <= count <= MAX_COUNT:
                raise PatternError(f"{here}: {word}: expected 1 to {MAX_COUNT}, got {count}")
            return (count, count) if word == "times" else (count, None)
    return 1, 1


def _condition(doc: Any, here: str, earlier: list[Step]) -> Condition:
    if not isinstance(doc, dict):
        raise PatternError(f"{here}: expected a table {{field, op, value}}")
    field = doc.get("field")
    if not isinstance(field, str) or not field:
        raise PatternError(f"{here}: field: expected the name of a field, got {_shown(field)}")
    op = doc.get("op")
    if op not in OPS:
        raise PatternError(f"{here}: op: expected one of {', '.join(OPS)}, got {_shown(op)}")
    if "value" in doc:
        _only(doc, {"field", "op", "value"}, f"{here} (a constant)")
        return Condition(field, op, _constant(doc["value"], here))
    if "step" not in doc:
        raise PatternError(f"{here}: expected a value, or a step and a step_field")
    _only(doc, {"field", "op", "step", "step_field"}, f"{here} (an earlier step's field)")
    named = doc["step"]
    index = next((n for n, step in enumerate(earlier) if step.name == named), None)
    if index is None:
        raise PatternError(f"{here}: step: {_shown(named)} is not an earlier step of the pattern")
    if earlier[index].absent:
        raise PatternError(
            f"{here}: step: {named!r} is absent: it matches no event to compare with"
        )
    step_field = doc.get("step_field")
    if not isinstance(step_field, str) or not step_field:
        raise PatternError(
            f"{here}: step_field: expected the name of a field, got {_shown(step_field)}"
        )
    return Condition(field, op, EarlierField(index, step_field))


def _constant(value: Any, here: str) -> Value:
    if isinstance(value, bool) or not isinstance(value, str | int | Decimal):
        raise PatternError(f"{here}: value: expected text or a number, got {_shown(value)}")
    if isinstance(value, Decimal) and not value.is_finite():
        raise PatternError(f"{here}: value: expected a finite number, got {value}")
    return value


def _within(value: Any, at: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | Decimal):
        raise PatternError(f"{at}: within: expected a number of seconds, got {_shown(value)}")
    if not Decimal(value).is_finite() or value < 0:
        raise PatternError(f"{at}: within: expected 0 or more seconds, got {value}")
    micros = Decimal(value) * MICROS
    if micros != micros.to_integral_value():
        raise PatternError(f"{at}: within: {value} is finer than a microsecond")
    return int(micros)


def _name(doc: dict[str, Any], word: str, where: str) -> str:
    name = doc.get(word)
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise PatternError(
            f"{where}: {word}: expected 1 to 100 of A-Z a-z 0-9 . _ -, got {_shown(name)}"
        )
    return name


def _flag(doc: dict[str, Any], word: str, here: str) -> bool:
    value = doc.get(word, False)
    if not isinstance(value, bool):
        raise PatternError(f"{here}: {word}: expected true or false, got {_shown(value)}")
    return value


def _only(doc: Mapping[str, Any], known: set[str], here: str) -> None:
    unknown = sorted(set(doc) - known)
    if unknown:
        raise PatternError(
            f"{here}: unknown {'field' if len(unknown) == 1 else 'fields'} {', '.join(unknown)}"
            f" (expected {', '.join(sorted(known))})"
        )


def _shown(value: Any) -> str:
    if value is None:
        return "nothing"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
