"""`faust -A app worker` that a test can make stuck (tests/integration/test_probes.py):
SIGTTIN blocks its event loop for HOLD_SECONDS; SIGURG pauses fetching of every
partition assigned to it, for good, as a consumer whose flow never resumed would."""

from __future__ import annotations

import signal
import sys
import time
from types import FrameType

from faust.cli.faust import cli

HOLD_SECONDS = 8.0


def block(signum: int, frame: FrameType | None) -> None:
    # Python runs signal handlers on the main thread, which is the event loop's.
    time.sleep(HOLD_SECONDS)


def pause(signum: int, frame: FrameType | None) -> None:
    from app.main import app

    consumer = app.consumer
    app.loop.call_soon_threadsafe(lambda: consumer.pause_partitions(consumer.assignment()))


if __name__ == "__main__":
    signal.signal(signal.SIGTTIN, block)  # mode takes SIGUSR1 and SIGUSR2
    signal.signal(signal.SIGURG, pause)
    sys.exit(cli())
