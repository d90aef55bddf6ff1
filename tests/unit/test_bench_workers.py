"""The two-worker benchmark starts a worker that exited on its own again, a few times."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench import workers
from bench.workers import Restarts


def test_an_exited_worker_is_started_again_with_its_env_then_the_run_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "worker-1.log"
    log.write_text("[INFO] ready\n[ERROR] commit failed, this worker is fenced\n[INFO] stopped\n")
    exited = subprocess.Popen(["false"])
    exited.wait()
    started: list[tuple[Path, dict[str, str] | None]] = []

    def start_worker(log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        started.append((log_path, env))
        return exited  # it exits again at once

    monkeypatch.setattr(workers, "start_worker", start_worker)
    live = subprocess.Popen(["sleep", "30"])
    envs = [{"PAIRSTREAM_DATA_DIR": "d-0"}, {"PAIRSTREAM_DATA_DIR": "d-1"}]
    restarts = Restarts([(live, tmp_path / "worker-0.log"), (exited, log)], envs, limit=2)
    try:
        restarts.restart(1)
        restarts.restart(1)
        assert restarts.count == 2
        assert started == [(log, envs[1]), (log, envs[1])]
        assert "worker 1 exited (1); started again" in capsys.readouterr().out
        with pytest.raises(RuntimeError, match="exited 1") as failed:
            restarts.restart(1)
        assert "[ERROR] commit failed, this worker is fenced" in str(failed.value)
        assert restarts.count == 2 and len(started) == 2
    finally:
        live.kill()
        live.wait()
