"""The container test's worker image, built in the background from the start of a test
session that includes that test. On a fresh machine the build takes minutes (debootstrap
makes the base, pip downloads the dependencies), mostly waiting on the network, which
the tests before it hide."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from tools import container

TOOLS = ("podman", "runc", "debootstrap")


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


class ImageBuild:
    """`python -m tools.container build` of one tag, its output in a log of its own (a
    subprocess writing into pytest's capture would land in whichever test is running)."""

    def __init__(self) -> None:
        # A tag of this session's own: test sessions on one machine (worktrees) must not
        # take each other's images.
        self.tag = f"{container.IMAGE}:test-{uuid.uuid4().hex[:8]}"
        handle, name = tempfile.mkstemp(prefix="pairstream-image-build-", suffix=".log")
        os.close(handle)
        self.log = Path(name)
        with self.log.open("wb") as log:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "tools.container", "build", "--tag", self.tag],
                cwd=container.ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def wait(self, timeout: float) -> str:
        """The tag, once built; raises with the end of the build's output if it failed."""
        try:
            code = self._process.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            tail = self.tail()
            self.cancel()
            raise RuntimeError(f"the image build took over {timeout:.0f} s:\n{tail}") from exc
        if code != 0:
            raise RuntimeError(f"the image build exited {code}:\n{self.tail()}")
        return self.tag

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def cancel(self) -> None:
        """Stop a build still running (the session ended before the test), drop the log."""
        if self._process.poll() is None:
            os.killpg(self._process.pid, signal.SIGKILL)  # podman too, not only python
            self._process.wait()
        self.log.unlink(missing_ok=True)

    def remove_image(self) -> None:
        container.podman("rmi", "--force", self.tag, check=False, capture=True)
