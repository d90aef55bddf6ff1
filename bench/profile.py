"""Where a worker's CPU goes: py-spy samples of the running process, summed by the
package of the frame that was executing (self time) and by function."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

# py-spy names a frame's file relative to its sys.path entry: its first component is
# the top-level package. Ours are pairstream's; others are named as they are.
OURS = {"app", "agents", "pairing", "tables", "tools", "bench"}
FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^:()]*)(?::\d+)?\)$")


@dataclass(frozen=True)
class Profile:
    samples: int
    by_package: list[tuple[str, float]]  # share of samples, largest first
    by_function: list[tuple[str, float]]


def py_spy() -> str | None:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    return found if Path(found).exists() else None


def start(pid: int, out: Path, rate: int = 200) -> subprocess.Popen[bytes]:
    """Sample a live process until `stop`, without pausing it (--nonblocking)."""
    spy = py_spy()
    if spy is None:
        raise FileNotFoundError("py-spy is not installed (pip install -e '.[dev]')")
    return subprocess.Popen(
        [spy, "record", "--pid", str(pid), "--rate", str(rate), "--format", "raw",
         "--nonblocking", "--output", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def stop(recorder: subprocess.Popen[bytes]) -> None:
    recorder.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
    recorder.wait(timeout=60)


def package_of(path: str) -> str:
    top = path.split("/", 1)[0] if "/" in path else "python (stdlib modules)"
    return "pairstream" if top in OURS else top


def summarize(raw: str, top: int = 15) -> Profile:
    """Self time per package and per function, from py-spy's raw (collapsed) output."""
    packages: Counter[str] = Counter()
    functions: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        leaf = stack.rsplit(";", 1)[-1]
        found = FRAME.match(leaf)
        function, path = (found["function"], found["file"]) if found else (leaf, "")
        package = package_of(path)
        packages[package] += count
        functions[f"{package}: {function} ({Path(path).name})"] += count
        total += count

    def shares(counter: Counter[str], n: int) -> list[tuple[str, float]]:
        return [(name, count / total) for name, count in counter.most_common(n)]

    return Profile(total, shares(packages, len(packages)), shares(functions, top))
