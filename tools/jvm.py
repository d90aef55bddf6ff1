"""What the project's Java processes (the broker, Kafka Connect) share: how one is
started from Maven's jars, and whether the one a pid file names still runs."""

from __future__ import annotations

import os
from pathlib import Path


def java(main: str, jars: Path, log_config: Path, heap: str, *args: str) -> list[str]:
    """The command line of `main` with every jar of `jars` on the class path."""
    return [
        "java", f"-Xmx{heap}", "-Xms128m", "-XX:+UseSerialGC",
        f"-Dlog4j2.configurationFile={log_config}",
        "-cp", f"{jars}/*", main, *args,
    ]  # fmt: skip


def running_pid(pid_file: Path) -> int | None:
    """The pid `pid_file` holds, if that process runs (a zombie does not)."""
    try:
        pid = int(pid_file.read_text())
        os.kill(pid, 0)
    except (FileNotFoundError, ValueError, ProcessLookupError):
        return None
    try:  # a process this one started stays a zombie until reaped
        reaped, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not our child: its parent reaps it
        return pid
    return None if reaped == pid else pid
