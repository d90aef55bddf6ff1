"""The condensed task dump a stalled benchmark worker's timeout reports."""

from __future__ import annotations

from bench.stalls import waiting

# The shape of mode's SIGUSR1 dump (mode.utils.logging.cry), cut down: a consumer commit
# waiting on aiokafka, our commit handler asleep, an idle connection reader.
DUMP = """\
TASKS
-------------------------------------------------
Stack for <Task pending name='Task-12' coro=<Consumer.commit() running at x> (...):
  File "/v/site-packages/faust/transport/consumer.py", line 1074, in _commit_offsets
    did_commit = await self._commit(committable_offsets)
    self = <ExactlyOnceConsumer: running >
  File "/v/site-packages/aiokafka/consumer/group_coordinator.py", line 900, in commit_offsets
    await asyncio.sleep(self._retry_backoff_ms / 1000)
Stack for <Task pending name='<coroutine object ExactlyOnceConsumer._commit_handler at 0x1>' (...):
  File "/r/app/exactly_once/consumer.py", line 208, in _commit_handler
    await self.sleep(at - time.monotonic())
  File "/usr/lib/python3.11/asyncio/tasks.py", line 476, in wait_for
    await waiter
Stack for <Task pending name='Task-3' coro=<AIOKafkaConnection._read() running at z>:
  File "/v/site-packages/aiokafka/conn.py", line 521, in _read
    resp = await reader.readexactly(4)
"""


def test_tasks_in_a_commit_or_our_code_are_reported_one_line_each() -> None:
    assert waiting(DUMP) == [
        "Task-12: _commit_offsets (faust/transport/consumer.py:1074)"
        " > commit_offsets (aiokafka/consumer/group_coordinator.py:900)",
        "<coroutine object ExactlyOnceConsumer._commit_handler at 0x1>:"
        " _commit_handler (app/exactly_once/consumer.py:208) > wait_for (tasks.py:476)",
    ]


def test_idle_library_tasks_are_left_out() -> None:
    idle = DUMP[DUMP.index("Stack for <Task pending name='Task-3'") :]
    assert waiting(idle) == []
