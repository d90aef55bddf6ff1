"""The delivery dispatcher: calls the API for each message whose intent is committed,
within a bounded window, and writes what happened to the delivery log.

Per partition of the processed-message store it keeps the messages not yet final
(`PartitionDeliveries`). A message is called only once the transaction holding its
intent has committed (`committed`), and, after an assignment, only once the delivery
log has been consumed up to where it ended at the assignment: an attempt or outcome
written by the previous owner is then in the store before anything is decided.

Each call is preceded by an `attempt` record and followed by a `failed` or `outcome`
record on the delivery log (acknowledged by the broker before going on); the agent
applies them to the store. `max_in_flight` calls run at once; messages waiting for a
retry hold no slot, so one failing message does not hold up the others.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from app.exactly_once.stats import Durations
from app.settings import Settings
from delivery.client import ApiClient
from delivery.rules import (
    Answer,
    Entry,
    LogRecord,
    Status,
    Verdict,
    backoff,
    judge,
    settle_remaining,
    uncertain_now,
)

log = logging.getLogger(__name__)

SendLog = Callable[[int, LogRecord], Awaitable[None]]  # partition, record; returns once acked


@dataclass(slots=True, eq=False)
class Order:
    """A message on its way to the API."""

    identity: str
    partition: int
    body: bytes
    key: str  # idempotency key
    offset: int | None  # its intent commits with this offset; None once committed
    attempts: int = 0
    uncertain: int = 0
    maybe_sent: bool = False  # the API may have it (its last attempt's fate is unknown)
    first_call: float | None = None  # monotonic
    called_ms: int = 0  # wall clock when the last attempt started


@dataclass(slots=True)
class PartitionDeliveries:
    partition: int
    log_target: int | None  # delivery log offset to consume before calling; None = reached
    orders: dict[str, Order] = field(default_factory=dict)  # not yet final, known here
    awaiting_commit: deque[Order] = field(default_factory=deque)  # by offset
    held: list[Order] = field(default_factory=list)  # committed, waiting for the catch-up
    in_flight: int = 0
    closed: bool = False
    drained: asyncio.Event = field(default_factory=asyncio.Event)
    # For the retention of final entries (delivery/agent.py): (record time, identity),
    # and the latest record time seen.
    finals: list[tuple[int, str]] = field(default_factory=list)
    stream_time_ms: int = 0

    @property
    def caught_up(self) -> bool:
        return self.log_target is None


def now_ms() -> int:
    return int(time.time() * 1000)


class Dispatcher:
    def __init__(self, conf: Settings, api: ApiClient, send_log: SendLog) -> None:
        self._conf = conf
        self._api = api
        self._send_log = send_log
        self._partitions: dict[int, PartitionDeliveries] = {}
        self._opening: dict[int, asyncio.Lock] = {}
        self._ready: asyncio.Queue[Order] = asyncio.Queue()
        self._room = asyncio.Event()
        self._room.set()
        self._workers: list[asyncio.Task[None]] = []
        self._in_flight: set[asyncio.Future[None]] = set()
        self._random = random.Random()
        self.counts: Counter[str] = Counter()  # this process's calls, as they happen
        self.latency = Durations()
        self._calls = 0

    # --- partitions ---------------------------------------------------------------

    def partition(self, number: int) -> PartitionDeliveries | None:
        return self._partitions.get(number)

    def opening(self, number: int) -> asyncio.Lock:
        """Held while a partition is being opened (the log's end is asked of the broker)."""
        return self._opening.setdefault(number, asyncio.Lock())

    def open(self, number: int, log_target: int | None) -> PartitionDeliveries:
        """Partition `number` is this worker's; nothing is called for it before the delivery
        log is consumed up to `log_target` (its end at the assignment)."""
        deliveries = PartitionDeliveries(number, log_target)
        self._partitions[number] = deliveries
        return deliveries

    def log_consumed(self, number: int, next_offset: int) -> bool:
        """The delivery log of a partition is consumed up to `next_offset`; True when that
        reaches the target, and the stored messages must now be resumed (`resume`)."""
        deliveries = self._partitions.get(number)
        if deliveries is None or deliveries.log_target is None:
            return False
        if next_offset < deliveries.log_target:
            return False
        deliveries.log_target = None
        self._update_room()
        return True

    def resume(
        self, number: int, stored: Iterable[tuple[str, Entry]], namespace_key: Callable[[str], str]
    ) -> None:
        """Call again, or decide about, every stored message of a caught-up partition
        that is not final."""
        deliveries = self._partitions.get(number)
        if deliveries is None:
            return
        resumed = 0
        for identity, entry in stored:
            if entry.terminal or identity in deliveries.orders or entry.body is None:
                continue
            order = Order(
                identity,
                number,
                entry.body,
                namespace_key(identity),
                offset=None,
                attempts=entry.attempts,
                uncertain=entry.uncertain,
                maybe_sent=uncertain_now(entry),
                called_ms=entry.called_ms,
            )
            deliveries.orders[identity] = order
            self._ready.put_nowait(order)
            resumed += 1
        # Those whose intent committed during the catch-up.
        for order in deliveries.held:
            self._ready.put_nowait(order)
        deliveries.held.clear()
        self.counts["resumed"] += resumed
        log.info("delivery partition %d caught up: %d stored messages resumed", number, resumed)

    async def close(self, numbers: Iterable[int], timeout: float) -> None:
        """Give partitions up: nothing new is called for them, and the calls in flight
        finish and are logged (within `timeout`) so that the next owner sees them."""
        closing = [d for n in numbers if (d := self._partitions.pop(n, None)) is not None]
        for deliveries in closing:
            deliveries.closed = True
        waiting = [d.drained.wait() for d in closing if d.in_flight]
        if waiting:
            try:
                await asyncio.wait_for(asyncio.gather(*waiting), timeout)
            except TimeoutError:
                log.warning("delivery: calls still in flight after %.0fs at revocation", timeout)
        self._update_room()

    # --- intake ------------------------------------------------------------------

    def intent(self, number: int, identity: str, body: bytes, key: str, offset: int) -> None:
        """A message's intent was written in the transaction that commits `offset`."""
        deliveries = self._partitions.get(number)
        if deliveries is None or identity in deliveries.orders:
            # Given up meanwhile (its next owner resumes it from the store), or the same
            # record processed again after a seek.
            return
        order = Order(identity, number, body, key, offset)
        deliveries.orders[identity] = order
        deliveries.awaiting_commit.append(order)
        self._update_room()

    def committed(self, number: int, offset: int) -> None:
        """The transaction of partition `number` committed everything before `offset`."""
        deliveries = self._partitions.get(number)
        if deliveries is None:
            return
        waiting = deliveries.awaiting_commit
        while waiting and waiting[0].offset is not None and waiting[0].offset < offset:
            order = waiting.popleft()
            order.offset = None
            if deliveries.caught_up:
                self._ready.put_nowait(order)
            else:
                deliveries.held.append(order)  # callable once the log is caught up

    def full(self) -> bool:
        return not self._room.is_set()

    async def room(self) -> None:
        await self._room.wait()

    def status(self) -> dict[str, object]:
        """What /stats and /metrics show of delivery on this worker."""
        partitions = self._partitions.values()
        in_flight = sum(d.in_flight for d in partitions)
        return {
            "in_flight": in_flight,
            "ready": self._ready.qsize(),
            "waiting": self.backlog() - in_flight,
            "catching_up": sorted(d.partition for d in partitions if not d.caught_up),
            "counts": dict(self.counts),
            "latency": self.latency.status(),
        }

    def backlog(self) -> int:
        """Messages not yet final: awaiting their commit, the catch-up, a slot or a retry,
        or in flight."""
        return sum(len(d.orders) for d in self._partitions.values())

    def _update_room(self) -> None:
        # Only callable partitions count: a partition still catching up needs the agent
        # (to consume its log) before its messages can drain, and must not block it.
        callable_backlog = sum(len(d.orders) for d in self._partitions.values() if d.caught_up)
        if callable_backlog >= 4 * self._conf.delivery_max_in_flight:
            self._room.clear()
        else:
            self._room.set()

    # --- calls -------------------------------------------------------------------

    async def run(self) -> None:
        self._workers = [
            asyncio.create_task(self._work(), name=f"delivery-{i}")
            for i in range(self._conf.delivery_max_in_flight)
        ]
        try:
            await asyncio.gather(*self._workers)
        finally:
            for worker in self._workers:
                worker.cancel()
            # A stop cancels this task first; the calls in flight go on to their outcome
            # (so that a clean stop leaves nothing uncertain), then the session closes.
            if self._in_flight:
                await asyncio.wait(self._in_flight, timeout=self._conf.delivery_timeout_seconds + 5)
            await self._api.close()

    async def _work(self) -> None:
        while True:
            order = await self._ready.get()
            deliveries = self._partitions.get(order.partition)
            if deliveries is None or deliveries.orders.get(order.identity) is not order:
                # Given up: the partition was closed (and maybe opened again here, with
                # its own order for this message, resumed from the store).
                continue
            deliveries.in_flight += 1
            deliveries.drained.clear()
            call = asyncio.ensure_future(self._call(order, deliveries))
            self._in_flight.add(call)
            call.add_done_callback(self._in_flight.discard)
            await asyncio.shield(call)  # cancelling this worker does not cut the call

    async def _call(self, order: Order, deliveries: PartitionDeliveries) -> None:
        try:
            await self._deliver(order, deliveries)
        except Exception:
            # The log could not be written (broker unreachable): try again later.
            log.exception("delivery of %s interrupted", order.identity)
            self._retry_later(order, deliveries, None)
        finally:
            deliveries.in_flight -= 1
            if deliveries.in_flight == 0:
                deliveries.drained.set()

    async def _deliver(self, order: Order, deliveries: PartitionDeliveries) -> None:
        conf = self._conf
        now = time.monotonic()
        if order.first_call is None:
            order.first_call = now
        if order.maybe_sent:
            settle = conf.delivery_settle_seconds
            if self._api.has_lookup and (
                settling := settle_remaining(order.called_ms, now_ms(), settle)
            ):
                # The API may still apply the last call: its "not found" could be untrue.
                self.counts["settling"] += 1
                asyncio.get_running_loop().call_later(settling, self._requeue, order, deliveries)
                return
            order.uncertain += 1
            self.counts["uncertain"] += 1
            if self._api.has_lookup:
                found = await self._api.has(order.key)
                self.counts["lookups"] += 1
                if found is None:
                    order.uncertain -= 1  # not decided yet: decided again on the retry
                    self._retry_later(order, deliveries, None)
                    return
                if found:
                    await self._finish(
                        order, deliveries, Status.DELIVERED, "found by status lookup", 200
                    )
                    return
            elif conf.delivery_uncertain == "park":
                await self._finish(
                    order, deliveries, Status.PARKED, "uncertain: maybe received", None
                )
                return
            order.maybe_sent = False
        if now - order.first_call > conf.delivery_deadline_seconds:
            reason = f"deadline: not delivered within {conf.delivery_deadline_seconds:.0f}s"
            await self._finish(order, deliveries, Status.DEAD, reason, None)
            return
        order.attempts += 1
        order.called_ms = now_ms()
        await self._send_log(
            order.partition,
            LogRecord(
                "attempt", order.identity, order.attempts, order.uncertain, at_ms=order.called_ms
            ),
        )
        answer, seconds = await self._api.send(order.key, order.body)
        self._calls += 1
        self.counts["calls"] += 1
        self.latency.observe(seconds)
        self._test_crash()
        verdict = judge(answer)
        if verdict is Verdict.DELIVERED:
            await self._finish(order, deliveries, Status.DELIVERED, "", answer.status)
        elif verdict is Verdict.REJECTED:
            reason = f"rejected: HTTP {answer.status}: {answer.excerpt}"
            await self._finish(order, deliveries, Status.DEAD, reason, answer.status)
        else:
            self.counts["retried"] += 1
            order.maybe_sent = answer.maybe_sent
            await self._send_log(
                order.partition,
                LogRecord(
                    "failed", order.identity, order.attempts, order.uncertain, answer.maybe_sent
                ),
            )
            self._retry_later(order, deliveries, answer)

    def _retry_later(
        self, order: Order, deliveries: PartitionDeliveries, answer: Answer | None
    ) -> None:
        conf = self._conf
        delay = backoff(
            order.attempts,
            conf.delivery_backoff_seconds,
            conf.delivery_backoff_max_seconds,
            answer.retry_after if answer is not None else None,
            self._random.random(),
        )
        asyncio.get_running_loop().call_later(delay, self._requeue, order, deliveries)

    def _requeue(self, order: Order, deliveries: PartitionDeliveries) -> None:
        if not deliveries.closed:
            self._ready.put_nowait(order)

    async def _finish(
        self,
        order: Order,
        deliveries: PartitionDeliveries,
        status: Status,
        reason: str,
        http_status: int | None,
    ) -> None:
        record = LogRecord(
            "outcome",
            order.identity,
            order.attempts,
            order.uncertain,
            status=status,
            reason=reason,
            http_status=http_status,
        )
        await self._send_log(order.partition, record)
        self.counts[status.value] += 1
        deliveries.orders.pop(order.identity, None)
        self._update_room()

    def _test_crash(self) -> None:
        limit = self._conf.delivery_crash_after_calls
        if limit is not None and self._calls >= limit:
            # Testing only: die between the API's answer and the recording of the outcome.
            log.warning("delivery_crash_after_calls=%d reached: killing this worker", limit)
            os.kill(os.getpid(), signal.SIGKILL)
