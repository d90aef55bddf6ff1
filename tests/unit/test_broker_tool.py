"""The local broker tool refuses to start a node on a port something else holds."""

from __future__ import annotations

import socket

import pytest

from tools import broker as local_broker


def test_start_refuses_a_taken_port() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        node = local_broker.Node(1, port, name="unit-taken-port")
        with pytest.raises(SystemExit, match=f"taken by another process: \\[{port}\\]"):
            local_broker.start([node], timeout=1)
    assert not (local_broker.RUNS / "unit-taken-port").exists()
