"""A worker with nothing to do: its share of a core, after its start has settled, with
its topics empty (docs/configuration.md, PAIRSTREAM_QUIET_FETCH_MAX_WAIT_SECONDS).

    python -m bench.idle --bootstrap 127.0.0.1:9092 [--seconds 30]
"""

from __future__ import annotations

import asyncio
import time

from app.kafka.admin import ensure_topics
from bench.cli import part_parser
from bench.latency import DEFAULT_COMMIT_INTERVAL
from bench.measure import cpu_seconds
from bench.pairstream import worker_run
from tools.demo import start_worker, stop_worker, wait_ready

SETTLE_SECONDS = 10.0  # after ready: the assignment's restores and first commits


async def run_idle(bootstrap: str, seconds: float, settle: float = SETTLE_SECONDS) -> float:
    """An idle worker's CPU seconds per second over `seconds`, after `settle` seconds."""
    run = worker_run("bench-idle", bootstrap, DEFAULT_COMMIT_INTERVAL)
    await ensure_topics(run.conf)
    worker = start_worker(run.log_path, run.env)
    try:
        await wait_ready(run.log_path, worker)
        await asyncio.sleep(settle)
        used, started = cpu_seconds(worker.pid), time.monotonic()
        await asyncio.sleep(seconds)
        share = (cpu_seconds(worker.pid) - used) / (time.monotonic() - started)
    finally:
        stop_worker(worker)
    await run.discard()
    return share


def main(argv: list[str] | None = None) -> None:
    parser = part_parser("python -m bench.idle", __doc__)
    parser.add_argument("--seconds", type=float, default=30.0, help="measured (default 30)")
    args = parser.parse_args(argv)
    share = asyncio.run(run_idle(args.bootstrap, args.seconds))
    print(f"idle worker: {share:.3f} of a core over {args.seconds:g} s", flush=True)


if __name__ == "__main__":
    main()
