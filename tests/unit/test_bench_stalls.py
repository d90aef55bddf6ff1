"""The condensed task dump a stalled benchmark worker's timeout reports."""

from __future__ import annotations

from pathlib import Path

from bench.stalls import log_excerpt, waiting

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


def test_a_crash_is_shown_from_its_first_error_and_the_log_from_its_end(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    crash = "[2026-11-29 08:18:40,001] [1947] [ERROR] [^PairstreamWorker]: Crashed reason=X"
    shutdown = [f"[INFO] [^--Service{n}]: Stopping..." for n in range(40)]
    log.write_text("\n".join(["[INFO] ready", crash, "Traceback (most recent call last):",
                              *shutdown, "[CRITICAL] We experienced a crash!"]))  # fmt: skip
    excerpt = log_excerpt(log, lines=5).splitlines()
    assert excerpt[:3] == ["(line 2: the first error)", crash, "Traceback (most recent call last):"]
    assert excerpt[-6:] == ["...", *shutdown[-4:], "[CRITICAL] We experienced a crash!"]


def test_a_log_without_an_error_before_its_end_is_shown_from_its_end(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    lines = [f"[INFO] line {n}" for n in range(10)]
    log.write_text("\n".join(lines))
    assert log_excerpt(log, lines=3).splitlines() == lines[-3:]
    log.write_text("\n".join([*lines, "[ERROR] at the end", "[INFO] stopped"]))
    assert log_excerpt(log, lines=3).splitlines() == [
        lines[-1],
        "[ERROR] at the end",
        "[INFO] stopped",
    ]
