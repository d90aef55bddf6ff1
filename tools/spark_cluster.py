"""A local Spark standalone cluster (one master, one worker) from pyspark's own
launch script, for running the analytics jobs with --master spark://…

    python -m tools.spark_cluster start [--port 7077]   prints the master URL
    python -m tools.spark_cluster stop

pip's pyspark has no start-master.sh; sbin/spark-daemon.sh starts the same classes.
Logs, pids and work dirs live in .run/spark/.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from pathlib import Path

import pyspark

from app.settings import ROOT

SPARK_HOME = Path(pyspark.__file__).parent
DAEMON = SPARK_HOME / "sbin" / "spark-daemon.sh"
MASTER = "org.apache.spark.deploy.master.Master"
WORKER = "org.apache.spark.deploy.worker.Worker"


def _env(run: Path) -> dict[str, str]:
    return {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOG_DIR": str(run / "logs"),
        "SPARK_PID_DIR": str(run / "pids"),
        "SPARK_WORKER_DIR": str(run / "work"),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_DAEMON_MEMORY": "512m",
        # The master's REST server would take port 6066, a worker's default web port.
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
        "SPARK_WORKER_OPTS": "-Dspark.worker.cleanup.enabled=true",
    }


def _daemon(run: Path, action: str, cls: str, *args: str) -> None:
    subprocess.run(
        ["bash", str(DAEMON), action, cls, "1", *args],
        env=_env(run), check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip


def start(port: int = 7077, run: Path = ROOT / ".run" / "spark", timeout: float = 90) -> str:
    """Start master and worker; return the master URL once the worker has registered."""
    url = f"spark://127.0.0.1:{port}"
    _daemon(run, "start", MASTER, "--host", "127.0.0.1", "--port", str(port),
            "--webui-port", str(port + 1000))  # fmt: skip
    _daemon(run, "start", WORKER, "--host", "127.0.0.1", "--cores", "2", "--memory", "1g",
            "--webui-port", str(port + 1001), url)  # fmt: skip
    deadline = time.monotonic() + timeout
    while not any("Successfully registered with master" in log.read_text(errors="replace")
                  for log in (run / "logs").glob("*Worker*.out")):  # fmt: skip
        if time.monotonic() > deadline:
            stop(run)
            raise RuntimeError(f"Spark worker did not register with {url}; logs in {run / 'logs'}")
        time.sleep(0.5)  # polling the worker's log
    return url


def stop(run: Path = ROOT / ".run" / "spark") -> None:
    for cls in (WORKER, MASTER):
        _daemon(run, "stop", cls)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.spark_cluster", description=__doc__)
    parser.add_argument("command", choices=["start", "stop"])
    parser.add_argument("--port", type=int, default=7077)
    args = parser.parse_args(argv)
    if args.command == "start":
        print(start(args.port))
    else:
        stop()


if __name__ == "__main__":
    main()
