"""Ports for the workers, PostgreSQL and Connect that tests and benchmarks start
(tools/ports.py): never one taken, never one given twice in a process."""

from __future__ import annotations

import socket

import pytest

from tools import ports


def test_a_port_is_given_once_and_never_one_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        bound = taken.getsockname()[1]
        start = next(p for p in range(20_000, 32_000) if p != bound and p + 1 != bound)
        monkeypatch.setattr(ports, "PORTS", [bound, start, start + 1])
        monkeypatch.setattr(ports, "_GIVEN", set())
        given = {ports.free_port(), ports.free_port()}
        assert given == {start, start + 1}  # both free ones, neither twice, not the bound one
        with pytest.raises(RuntimeError, match="no free port"):
            ports.free_port()
