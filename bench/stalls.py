"""What a benchmark worker that stopped making progress was waiting on: its asyncio
tasks' stacks, asked for with SIGUSR1 (mode's worker then writes every thread's and
task's stack to its log), condensed to the tasks in a commit, a flush or our own
code. A stall seen once in CI left nothing else to go on."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

TASK = re.compile(r"^Stack for <Task \w+ name='(?P<name>[^']*)'")
FRAME = re.compile(r'^  File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)')
WAITS = ("commit", "flush")
ERROR = re.compile(r"\[(ERROR|CRITICAL)\]|^Traceback \(")
# The project's top packages: a frame in one of them is ours.
PACKAGES = frozenset(
    {"agents", "analytics", "app", "bench", "delivery", "pairing", "tables", "tools", "web"}
)


def stalled_worker(pid: int, log_path: Path, wait: float = 3.0) -> str:
    """The waiting tasks of the running worker `pid`, whose output goes to `log_path`."""
    start = log_path.stat().st_size
    os.kill(pid, signal.SIGUSR1)
    time.sleep(wait)  # the dump is written from the worker's event loop
    with log_path.open("rb") as log:
        log.seek(start)
        dump = log.read().decode(errors="replace")
    return "\n".join([f"== waiting tasks of worker {pid} (all: {log_path})", *waiting(dump)])


def log_excerpt(log_path: Path, lines: int = 30) -> str:
    """The first error in a worker's log with the lines after it, then the log's end: a
    crash's cause is logged where it happens, often long before the shutdown that ends
    the log (CI once showed only that shutdown)."""
    text = log_path.read_text(errors="replace").splitlines()
    tail = text[-lines:]
    first = next((n for n, line in enumerate(text) if ERROR.search(line)), len(text))
    if first >= len(text) - lines:  # no error, or one within the tail
        return "\n".join(tail)
    return "\n".join(
        [f"(line {first + 1}: the first error)", *text[first : first + lines], "...", *tail]
    )


def waiting(dump: str) -> list[str]:
    """One line per task of the dump whose stack is in a commit, a flush or pairstream's
    code (not the dump's own): its frames, outermost first."""
    tasks: list[tuple[str, list[tuple[str, str, bool]]]] = []
    for line in dump.splitlines():
        if task := TASK.match(line):
            tasks.append((task["name"], []))
        elif tasks and (frame := FRAME.match(line)):
            path = frame["path"]
            library = path.partition("site-packages/")[2]
            ours = not library and "/lib/python" not in path and "/.venv/" not in path
            # Ours from its package (app/exactly_once/consumer.py), a library's from its
            # package, the stdlib's by name.
            where = _ours(path) if ours else library or Path(path).name
            tasks[-1][1].append((frame["function"], f"{where}:{frame['line']}", ours))
    return [
        f"{name}: " + " > ".join(f"{function} ({where})" for function, where, _ in frames)
        for name, frames in tasks
        if "_cry" not in name
        and any(ours or any(word in function for word in WAITS) for function, _, ours in frames)
    ]


def _ours(path: str) -> str:
    """A project path from its top package: the checkout's folder varies."""
    parts = Path(path).parts
    top = next((n for n, part in enumerate(parts) if part in PACKAGES), len(parts) - 2)
    return "/".join(parts[top:])
