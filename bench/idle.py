"""A worker with nothing to do: its share of a core, after its start has settled, with
its topics empty (docs/configuration.md, PAIRSTREAM_QUIET_FETCH_MAX_WAIT_SECONDS); the
Quix Streams app the same way, beside it.

    python -m bench.idle --bootstrap 127.0.0.1:9092 [--seconds 30]
"""

from __future__ import annotations

import asyncio
import time
import uuid

from app.kafka.admin import ensure_topics
from bench.cli import part_parser
from bench.latency import DEFAULT_COMMIT_INTERVAL, QUIX
from bench.measure import cpu_seconds
from bench.pairstream import discard_run, worker_run
from bench.quix import start_app, state_dir
from bench.workload import create_topic, delete_topics
from tools.demo import start_worker, stop_worker, wait_ready

SETTLE_SECONDS = 10.0  # after ready: the assignment's restores and first commits
# The Quix Streams app says nothing when it has joined: its start, join and first
# commits are over well within this.
QUIX_SETTLE_SECONDS = 20.0


async def share_of_a_core(pid: int, seconds: float) -> float:
    used, started = cpu_seconds(pid), time.monotonic()
    await asyncio.sleep(seconds)
    return (cpu_seconds(pid) - used) / (time.monotonic() - started)


async def run_idle(bootstrap: str, seconds: float, settle: float = SETTLE_SECONDS) -> float:
    """An idle worker's CPU seconds per second over `seconds`, after `settle` seconds."""
    run = worker_run("bench-idle", bootstrap, DEFAULT_COMMIT_INTERVAL)
    await ensure_topics(run.conf)
    worker = start_worker(run.log_path, run.env)
    try:
        await wait_ready(run.log_path, worker)
        await asyncio.sleep(settle)
        share = await share_of_a_core(worker.pid, seconds)
    finally:
        stop_worker(worker)
    await run.discard()
    return share


async def run_quix_idle(bootstrap: str, seconds: float) -> float:
    """The Quix Streams app at its defaults over empty topics, the same way."""
    group = f"bench-quix-idle-{uuid.uuid4().hex[:8]}"
    source, sink = f"{group}-input", f"{group}-pairs"
    for topic in (source, sink):
        await create_topic(bootstrap, topic)
    app, _ = start_app(bootstrap, source, sink, group, QUIX.commit_interval)
    try:
        await asyncio.sleep(QUIX_SETTLE_SECONDS)
        if app.poll() is not None:
            raise RuntimeError(f"the Quix Streams app exited ({app.returncode})")
        share = await share_of_a_core(app.pid, seconds)
    finally:
        app.terminate()
        app.wait()
    await delete_topics(bootstrap, group)
    discard_run(state_dir(group))
    return share


def main(argv: list[str] | None = None) -> None:
    parser = part_parser("python -m bench.idle", __doc__)
    parser.add_argument("--seconds", type=float, default=30.0, help="measured (default 30)")
    args = parser.parse_args(argv)
    share = asyncio.run(run_idle(args.bootstrap, args.seconds))
    print(f"idle worker: {share:.3f} of a core over {args.seconds:g} s", flush=True)
    quix = asyncio.run(run_quix_idle(args.bootstrap, args.seconds))
    print(f"idle Quix Streams app: {quix:.3f} of a core over {args.seconds:g} s", flush=True)


if __name__ == "__main__":
    main()
