"""python -m analytics ingest|windows|reconcile|replica|ctr|all [--master spark://host:7077]
python -m analytics schedule --every 5m      run `all` on a fixed period (local use)
python -m analytics jars                      resolve Spark's Delta and Kafka jars (once)

Exits 1 when reconciliation finds a discrepancy; cron or a Kubernetes CronJob can
alert on that.
"""

from __future__ import annotations

import argparse
import re
import sys
import time

from app.kafka.access import EX_CONFIG, KafkaAccessError
from app.kafka.connection import KafkaConfigError
from app.settings import Settings, settings

try:
    from analytics.jobs import JOBS, run
    from analytics.spark import JARS, spark_jars
except ModuleNotFoundError as missing:
    if (missing.name or "").split(".")[0] not in ("pyspark", "delta", "matplotlib"):
        raise
    sys.exit(
        f"python -m analytics needs the analytics extra: pip install '.[analytics]' ({missing})"
    )


def period_seconds(text: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([smh]?)", text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"not a period: {text!r} (e.g. 30s, 5m, 1h)")
    return float(match[1]) * {"": 1, "s": 1, "m": 60, "h": 3600}[match[2]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m analytics",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("job", choices=[*JOBS, "schedule", "jars"])
    parser.add_argument("--master", help="Spark master (default: settings, local[*])")
    parser.add_argument("--every", type=period_seconds, default=300.0, help="schedule period")
    args = parser.parse_args(argv)
    try:
        return run_jobs(args, settings())
    except (KafkaAccessError, KafkaConfigError) as exc:
        print(f"cannot run: {exc}", file=sys.stderr)
        return EX_CONFIG


def run_jobs(args: argparse.Namespace, conf: Settings) -> int:
    if args.job == "jars":  # resolve Spark's extra jars now, not at the first job
        print(f"{len(spark_jars())} jars in {JARS}")
        return 0
    if args.job != "schedule":
        return 0 if run(args.job, conf, args.master) else 1
    while True:
        started = time.monotonic()
        ok = run("all", conf, args.master)
        print(f"scheduled run {'ok' if ok else 'FOUND DISCREPANCIES'}", flush=True)
        time.sleep(max(0.0, args.every - (time.monotonic() - started)))


if __name__ == "__main__":
    sys.exit(main())
