"""The processing-error boundary of a step (app/exactly_once/step.py): a record whose handler raises
is dead-lettered with the exception, in its step's transaction, with none of what the
handler did before it raised; the records around it go on. The real step, with the
transaction's sends replaced."""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Overflow
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import ProducerFenced
from faust.types import TP

from app.exactly_once import outbox_sends, step
from app.exactly_once.local_state import LocalPartition
from app.exactly_once.partition_tasks import PartitionTask, PartitionTasks
from app.faust_app import app
from app.settings import settings
from web.status import processing_errors

DEPOSITS = TP("deposits", 2)
DLQ = "deposits.dlq"
POISON = b'{"amount": 1e999999999}'


class Seen(list[int]):
    """What a processor remembers of the records it handled."""


class Handler:
    """An agent's handler of one record: an output, a table write and the processor's
    memory of it, and then, for a record marked poison, an exception."""

    def __init__(self) -> None:
        self.sent: list[list[tuple[str, bytes | None, bytes | None, int | None]]] = []
        self.acked: list[int] = []
        self.local = LocalPartition(
            SimpleNamespace(changelog_topic=SimpleNamespace(get_topic_name=lambda: "state")), 2
        )

    async def send(self, _: Any, tp: TP, records: list[Any]) -> list[Any]:
        self.sent.append(list(records))
        return [None] * len(records)

    def event(self, offset: int, value: bytes) -> Any:
        message = SimpleNamespace(
            tp=DEPOSITS,
            topic=DEPOSITS.topic,
            partition=DEPOSITS.partition,
            offset=offset,
            key=b"k%d" % offset,
            value=value,
        )
        return SimpleNamespace(message=message, ack=lambda: self.acked.append(offset))

    def handle(self, task: PartitionTask, offset: int, value: bytes) -> None:
        task.outbox.send("deposits.validated", None, b"out %d" % offset, None)
        task.writes.stage(self.local, b"seen %d" % offset, b"")
        task.processor(Seen, lambda _: Seen()).append(offset)
        task.outbox.count("validated")
        if value == POISON:
            raise Overflow("above Emax")

    async def run(self, offset: int, value: bytes = b"{}") -> PartitionTask:
        async with step.exactly_once(app, self.event(offset, value), dead_letters=DLQ) as task:
            self.handle(task, offset, value)
        return task


@pytest.fixture
def handler(own_tasks: PartitionTasks, monkeypatch: pytest.MonkeyPatch) -> Handler:
    found = Handler()
    monkeypatch.setattr(outbox_sends, "send_in_transaction", found.send)
    own_tasks.assigned({DEPOSITS})
    return found


def dead_letter(record: tuple[str, bytes | None, bytes | None, int | None]) -> dict[str, Any]:
    topic, key, value, _ = record
    assert topic == DLQ and value is not None
    return {"key": key, **json.loads(value)}


async def test_a_record_whose_handler_raises_is_dead_lettered_alone(handler: Handler) -> None:
    await handler.run(0)
    task = await handler.run(1, POISON)
    assert task.loaded(Seen) is None  # its memory of the poison record went with it
    await handler.run(2)
    assert handler.acked == [0, 1, 2]
    first, poison, last = handler.sent
    assert [topic for topic, *_ in first] == ["deposits.validated", "state"]
    assert [topic for topic, *_ in last] == ["deposits.validated", "state"]
    # Neither its output nor its table write: the dead letter only, in its transaction.
    assert [dead_letter(record) for record in poison] == [
        {
            "key": b"k1",
            "reason": "processing error: Overflow: above Emax",
            "source_topic": "deposits",
            "source_partition": 2,
            "source_offset": 1,
            "id": None,
            "value": POISON.decode(),
        }
    ]
    assert task.loaded(Seen) == [2]
    counts = app.partition_tasks.stats.partitions[DEPOSITS]
    assert (counts["processing_errors"], counts["validated"]) == (1, 2)
    assert processing_errors() == {
        "total": 1,
        "partitions": [{"topic": "deposits", "partition": 2, "count": 1}],
    }


async def test_while_held_only_a_step_with_nothing_mixed_in_is_dead_lettered(
    handler: Handler, monkeypatch: pytest.MonkeyPatch
) -> None:
    crashes: list[BaseException] = []
    monkeypatch.setattr(app, "crash", lambda exc: exc)  # what add_future is given: the cause
    monkeypatch.setattr(app, "add_future", crashes.append)
    task = app.partition_tasks.get(DEPOSITS)
    assert task is not None
    task.committing = True  # its transaction commits: steps are held
    await handler.run(0, POISON)  # the first held: what it did is all the outbox holds
    await handler.run(1)
    before = list(task.outbox.records)

    async def raising_first(offset: int) -> None:
        async with step.exactly_once(app, handler.event(offset, POISON), dead_letters=DLQ):
            raise Overflow("above Emax")

    await raising_first(2)  # raised before doing anything
    assert task.outbox.records[: len(before)] == before
    records = task.outbox.records
    assert [topic for topic, *_ in records] == [DLQ, "deposits.validated", DLQ]
    assert [dead_letter(records[i])["source_offset"] for i in (0, 2)] == [0, 2]
    with pytest.raises(Overflow):
        await handler.run(3, POISON)  # its output is mixed with the held steps' ones
    assert task.broken and [type(exc) for exc in crashes] == [Overflow]
    assert handler.acked == [0, 1, 2]


@pytest.mark.parametrize(
    ("policy", "raised"),
    [("stop", lambda: Overflow("above Emax")), ("dead-letter", lambda: ProducerFenced())],
)
async def test_a_stop_policy_or_a_failed_transaction_crashes_the_step(
    handler: Handler,
    monkeypatch: pytest.MonkeyPatch,
    policy: str,
    raised: Callable[[], Exception],
) -> None:
    chosen = settings().model_copy(update={"processing_error_policy": policy})
    monkeypatch.setattr(step, "settings", lambda: chosen)
    await handler.run(0)
    with pytest.raises(type(raised())):
        async with step.exactly_once(app, handler.event(1, POISON), dead_letters=DLQ) as task:
            handler.handle(task, 1, b"{}")
            raise raised()
    assert handler.acked == [0] and len(handler.sent) == 1
    assert task.loaded(Seen) is None and task.outbox.records == []
    assert app.partition_tasks.stats.partitions[DEPOSITS]["processing_errors"] == 0


def run_of(handler: Handler, values: list[bytes]) -> tuple[Any, list[Any]]:
    """A run's event (its offset the last record's) and its records."""
    records = [
        SimpleNamespace(offset=offset, timestamp=1_000 + offset, key=b"k%d" % offset, value=v)
        for offset, v in enumerate(values)
    ]
    return handler.event(len(values) - 1, b""), records


def handle_run(handler: Handler) -> Callable[[PartitionTask, step.RunRecords], None]:
    def handle(task: PartitionTask, records: step.RunRecords) -> None:
        for record in records.each():
            handler.handle(task, record.offset, record.value)

    return handle


async def test_a_run_goes_on_past_its_poison_records_in_one_transaction(
    handler: Handler,
) -> None:
    event, records = run_of(handler, [b"{}", POISON, b"{}", POISON, b"{}"])
    await step.run_once(app, event, records, handle_run(handler), dead_letters=DLQ)
    assert handler.acked == [4]
    (sent,) = handler.sent  # one transaction: the run's
    outputs = [value for topic, _, value, _ in sent if topic == "deposits.validated"]
    writes = [key for topic, key, _, _ in sent if topic == "state"]
    assert outputs == [b"out 0", b"out 2", b"out 4"]  # none of a poison record's, once each
    assert writes == [b"seen 0", b"seen 2", b"seen 4"]
    letters = [dead_letter(record) for record in sent if record[0] == DLQ]
    assert [(d["key"], d["source_offset"], d["value"]) for d in letters] == [
        (b"k1", 1, POISON.decode()),
        (b"k3", 3, POISON.decode()),
    ]
    assert {d["reason"] for d in letters} == {"processing error: Overflow: above Emax"}
    task = app.partition_tasks.get(DEPOSITS)
    assert task is not None and task.loaded(Seen) == [0, 2, 4]
    counts = app.partition_tasks.stats.partitions[DEPOSITS]
    assert (counts["processing_errors"], counts["validated"]) == (2, 3)


async def test_a_run_that_raises_after_its_records_crashes_the_step(handler: Handler) -> None:
    event, records = run_of(handler, [b"{}", b"{}"])

    def handle(task: PartitionTask, run: step.RunRecords) -> None:
        handle_run(handler)(task, run)
        raise Overflow("no record's doing")

    with pytest.raises(Overflow):
        await step.run_once(app, event, records, handle, dead_letters=DLQ)
    assert handler.acked == [] and handler.sent == []
    task = app.partition_tasks.get(DEPOSITS)
    assert task is not None and task.loaded(Seen) is None and task.outbox.records == []


async def test_a_record_named_after_the_loop_is_dead_lettered_and_the_run_goes_on(
    handler: Handler,
) -> None:
    """As the patterns' stage does when a state written at the step's end is refused:
    the record that changed it last is set aside, the run handled again without it."""
    event, records = run_of(handler, [b"{}", b"{}", b"{}"])

    def handle(task: PartitionTask, run: step.RunRecords) -> None:
        handle_run(handler)(task, run)
        offsets = [record.offset for record in run]
        if 1 in offsets:
            run.current = offsets.index(1)
            raise Overflow("refused at the end")

    await step.run_once(app, event, records, handle, dead_letters=DLQ)
    assert handler.acked == [2]
    (sent,) = handler.sent
    assert [v for topic, _, v, _ in sent if topic == "deposits.validated"] == [b"out 0", b"out 2"]
    letters = [dead_letter(record) for record in sent if record[0] == DLQ]
    assert [(d["source_offset"], d["reason"]) for d in letters] == [
        (1, "processing error: Overflow: refused at the end")
    ]


@pytest.mark.parametrize("what", ["output", "table write"])
async def test_a_record_too_large_to_write_is_a_processing_error_of_its_input(
    handler: Handler, what: str
) -> None:
    """An output or a table write past PAIRSTREAM_MAX_RECORD_BYTES is refused in the step,
    before any send: the input that made it is dead-lettered, the next goes on."""
    huge = b"x" * (settings().max_record_bytes + 1)
    await handler.run(0)
    async with step.exactly_once(app, handler.event(1, b"{}"), dead_letters=DLQ) as task:
        if what == "output":
            task.outbox.send("deposits.validated", b"k", huge, None)
        else:
            task.writes.stage(handler.local, b"k", huge)
    await handler.run(2)
    assert handler.acked == [0, 1, 2]
    _, refused, _ = handler.sent
    ((letter),) = [dead_letter(record) for record in refused]
    topic = "deposits.validated" if what == "output" else "state"
    size = settings().max_record_bytes + 2
    assert letter["reason"] == (
        f"processing error: RecordTooLarge: a record for {topic} of {size} bytes"
        f" > {settings().max_record_bytes}"
    )
