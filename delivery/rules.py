"""Once-only delivery to a third-party API: the pure rules (docs/delivery.md).

A message to deliver has an identity (its `id` field, else a fingerprint of its
bytes). Its entry in the processed-message store goes through:

    queued ──attempt──▶ calling ──outcome──▶ delivered | dead | parked
       ▲                   │
       └──── failed ───────┘   (the API answered "not taken", or may have it: maybe_sent)

`queued` is written in the transaction that consumes the message (the intent);
`attempt`, `failed` and `outcome` are records on the delivery log, written before
and after each HTTP call and applied to the store by the step that consumes them.
An entry found `calling`, or `maybe_sent`, when its call is decided again is
uncertain: the API may have it.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, replace
from enum import Enum, StrEnum
from typing import Any

from pairing import grammar


class Status(StrEnum):
    QUEUED = "queued"
    CALLING = "calling"
    DELIVERED = "delivered"
    DEAD = "dead"  # rejected by the API (4xx) or out of time: on the dead-letter topic
    PARKED = "parked"  # uncertain, left to a person: on the uncertain topic


TERMINAL = frozenset({Status.DELIVERED, Status.DEAD, Status.PARKED})


@dataclass(frozen=True, slots=True)
class Entry:
    """A message in the processed-message store."""

    status: Status
    at_ms: int  # the record's timestamp: retention counts from it
    body: bytes | None  # kept until the entry is terminal
    attempts: int = 0
    uncertain: int = 0  # times it was decided again while the API may have had it
    maybe_sent: bool = False  # an earlier attempt may have reached the API
    called_ms: int = 0  # wall clock when the last attempt started: the settle time counts from it

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


def identity(value: bytes, parsed: dict[str, Any], id_field: str) -> str:
    """`id:` and the message's id when it has one in the grammar (docs/grammar.md), else
    a fingerprint of its bytes."""
    found = grammar.identity(parsed.get(id_field), id_field)
    if isinstance(found, str):
        return f"id:{found}"
    return "sha256:" + hashlib.sha256(value).hexdigest()


def idempotency_key(namespace: str, identity: str) -> str:
    """The same for every call of one message, different across apps."""
    return hashlib.sha256(f"{namespace}/{identity}".encode()).hexdigest()[:40]


def parse_order(value: bytes | None) -> dict[str, Any] | str:
    """The message as a JSON object (docs/grammar.md), or why it cannot be delivered;
    its size is checked before (`pairing.grammar.oversize`)."""
    parsed = grammar.decode_object(value)
    return f"invalid: {parsed.reason}" if isinstance(parsed, grammar.Rejection) else parsed


# --- the HTTP answer and what follows from it -------------------------------------


class Verdict(Enum):
    DELIVERED = "delivered"
    RETRY = "retry"
    REJECTED = "rejected"


@dataclass(frozen=True, slots=True)
class Answer:
    """What one call came back with. `status` is None when no HTTP answer arrived;
    `maybe_sent` then says whether the request may have reached the API."""

    status: int | None
    maybe_sent: bool = False
    retry_after: float | None = None
    excerpt: str = ""


def judge(answer: Answer) -> Verdict:
    status = answer.status
    if status is None or status in (408, 429) or status >= 500:
        return Verdict.RETRY
    if 200 <= status < 300:
        return Verdict.DELIVERED
    return Verdict.REJECTED


def backoff(
    attempt: int, initial: float, cap: float, retry_after: float | None, jitter: float
) -> float:
    """Delay before attempt `attempt + 1`: exponential with jitter (0..1), or what the
    API asked for in Retry-After, whichever is longer, up to the cap."""
    delay: float = min(cap, initial * 2.0 ** max(0, attempt - 1)) * (0.5 + jitter / 2)
    if retry_after is not None:
        delay = max(delay, retry_after)
    return min(cap, delay)


def parse_retry_after(header: str | None) -> float | None:
    """Retry-After in seconds (an HTTP date is not honoured: None)."""
    if header is None:
        return None
    try:
        seconds = float(header)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


# --- the delivery log and the store ----------------------------------------------


@dataclass(frozen=True, slots=True)
class LogRecord:
    """An attempt starting, an attempt failing, or a final outcome."""

    kind: str  # "attempt" | "failed" | "outcome"
    identity: str
    attempt: int
    uncertain: int
    maybe_sent: bool = False  # failed: whether the API may have it
    status: Status | None = None  # outcome
    reason: str = ""  # outcome dead or parked: why
    http_status: int | None = None
    at_ms: int = 0  # attempt: wall clock when it started (before its request was sent)


@dataclass(frozen=True, slots=True)
class Applied:
    entry: Entry
    outcome: Status | None  # a final outcome reached by this record


def apply(entry: Entry | None, record: LogRecord) -> Applied | None:
    """A log record applied to its entry; None when it changes nothing (no entry, the
    entry is already final, or the record is older than what the entry has seen)."""
    if entry is None or entry.terminal or record.attempt < entry.attempts:
        return None
    uncertain = max(entry.uncertain, record.uncertain)
    if record.kind == "attempt":
        if record.attempt == entry.attempts:
            return None  # seen already (a producer retry may repeat or reorder it)
        calling = replace(
            entry,
            status=Status.CALLING,
            attempts=record.attempt,
            uncertain=uncertain,
            called_ms=record.at_ms,
        )
        return Applied(calling, None)
    if record.kind == "failed":
        if record.attempt != entry.attempts or entry.status is not Status.CALLING:
            return None
        failed = replace(
            entry, status=Status.QUEUED, uncertain=uncertain, maybe_sent=record.maybe_sent
        )
        return Applied(failed, None)
    assert record.status in TERMINAL
    done = replace(
        entry,
        status=record.status,
        attempts=record.attempt,
        uncertain=uncertain,
        body=None,
        maybe_sent=False,
    )
    return Applied(done, record.status)


def uncertain_now(entry: Entry) -> bool:
    """Whether the API may already have this message, as it is about to be decided."""
    return entry.status is Status.CALLING or entry.maybe_sent


def settle_remaining(called_ms: int, now_ms: int, settle_seconds: float) -> float:
    """Seconds an uncertain message must still wait before it may be looked up.

    A status lookup's "not found" is only true once the API can no longer apply the
    last call: an API still processing a request the client gave up on answers "not
    found" too. So the lookup waits until the settle time has passed since that call
    started (by the wall clock, which survives a crash of the worker that made it)."""
    return max(0.0, called_ms / 1000 + settle_seconds - now_ms / 1000)


def encode_entry(entry: Entry) -> bytes:
    record: dict[str, Any] = {
        "s": entry.status.value,
        "t": entry.at_ms,
        "a": entry.attempts,
        "u": entry.uncertain,
        "m": entry.maybe_sent,
        "c": entry.called_ms,
    }
    if entry.body is not None:
        record["b"] = base64.b64encode(entry.body).decode()
    return json.dumps(record, separators=(",", ":")).encode()


def decode_entry(data: bytes) -> Entry:
    record = json.loads(data)
    body = record.get("b")
    return Entry(
        status=Status(record["s"]),
        at_ms=record["t"],
        body=None if body is None else base64.b64decode(body),
        attempts=record["a"],
        uncertain=record["u"],
        maybe_sent=record["m"],
        called_ms=record.get("c", 0),
    )


def encode_log(record: LogRecord) -> bytes:
    data: dict[str, Any] = {
        "kind": record.kind,
        "id": record.identity,
        "attempt": record.attempt,
        "uncertain": record.uncertain,
    }
    if record.kind == "attempt":
        data["at_ms"] = record.at_ms
    if record.kind == "failed":
        data["maybe_sent"] = record.maybe_sent
    if record.status is not None:
        data["status"] = record.status.value
        data["reason"] = record.reason
        data["http_status"] = record.http_status
    return json.dumps(data, separators=(",", ":")).encode()


def decode_log(data: bytes) -> LogRecord:
    record = json.loads(data)
    status = record.get("status")
    return LogRecord(
        kind=record["kind"],
        identity=record["id"],
        attempt=record["attempt"],
        uncertain=record["uncertain"],
        maybe_sent=record.get("maybe_sent", False),
        status=None if status is None else Status(status),
        reason=record.get("reason", ""),
        http_status=record.get("http_status"),
        at_ms=record.get("at_ms", 0),
    )
