"""The buffers faust puts fetched records in for the streams and for table restores."""

from __future__ import annotations

import logging
from typing import Any, TypeVar

from mode.utils.queues import FlowControlEvent, ThrowableQueue

log = logging.getLogger(__name__)
T = TypeVar("T")


class RebalanceSafeQueue(ThrowableQueue[T]):
    """faust's buffer of fetched records (a stream's, or the restore's changelog
    queue), which a rebalance clears: the fetch then starts again from the committed
    offset, or from where the restore stands.

    faust's fetcher hands a record to a full buffer in a put task of its own, which
    nothing cancels. If the rebalance suspends the flow before that task first runs,
    it waits for the flow and puts its record after the clearing, ahead of what the
    fetch brings again. A restore took such a record as the offset it had reached and
    dropped the 2,040 committed records before it as already applied: 86 pairs lost
    (docs/fault-matrix.md, defects). So a put that waited for the flow while the
    buffer was cleared is dropped; its record is fetched again."""

    def __init__(self, maxsize: int = 0, *, flow_control: FlowControlEvent, **kwargs: Any) -> None:
        super().__init__(maxsize, flow_control=flow_control, **kwargs)
        self.flow = flow_control
        self.clearings = 0

    def clear(self) -> None:
        self.clearings += 1
        super().clear()

    async def put(self, value: T) -> None:
        clearings = self.clearings
        await self.flow.acquire()  # returns at once unless a rebalance suspended the flow
        if self.clearings != clearings:
            log.info(
                "dropped a record fetched before its buffer was cleared: %r",
                getattr(value, "message", value),
            )
            return
        await super().put(value)  # its own wait for the flow returns at once now


class ResumeKeepsFetchedFlowControl(FlowControlEvent):
    """faust's flow control, whose resume clears the buffers only when it ends a
    suspension.

    mode's `resume` clears every managed buffer each time it is called, and faust's
    recovery calls it again while the flow runs: when the standbys start, and when
    recovery completes. Changelog records fetched for a standby in between were
    thrown away with aiokafka's position past them: the standby kept a hole and
    persisted an offset saying it had everything (docs/faust-gaps.md, 30). A
    rebalance still clears the buffers: it suspends the flow, and the resume that
    ends the suspension clears them."""

    def resume(self) -> None:
        if self.is_active():
            return
        super().resume()
