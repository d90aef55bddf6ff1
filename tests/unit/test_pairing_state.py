"""A keyed partition's store keeps the key states it last read or wrote, and reads
and decodes a state from the table only when it does not have it. Real rocksdict
databases under the fake table store of test_local_state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import tables.pairing_state as pairing_state
from app.exactly_once.local_state import LocalState
from app.exactly_once.partition_tasks import PartitionTask
from pairing.key_state import KeyState, PendingEvent
from tables.pairing_state import PartitionState
from tests.unit.test_local_state import A, fake_table


def state(time_us: int, value: int) -> KeyState:
    return KeyState(time_us, (f"a{value}",), PendingEvent("A", value, f"a{value}", 1.5))


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[bytes]:
    """The table the store writes, and every state it decodes from it."""
    monkeypatch.setattr(pairing_state, "table", fake_table(tmp_path))
    decoded: list[bytes] = []
    decode = pairing_state.decode_state

    def counting(raw: bytes) -> Any:
        decoded.append(raw)
        return decode(raw)

    monkeypatch.setattr(pairing_state, "decode_state", counting)
    return decoded


def test_a_state_written_is_read_back_without_the_table(decodes: list[bytes]) -> None:
    task = PartitionTask(A, LocalState())
    store = PartitionState(task)
    written = state(1, 7)
    store.put("k", written)
    assert store.get("k") is written and decodes == []
    # What it kept is what the table holds (another store reads the step's writes).
    assert PartitionState(task).get("k") == written and len(decodes) == 1


def test_a_key_deleted_is_gone(decodes: list[bytes]) -> None:
    store = PartitionState(PartitionTask(A, LocalState()))
    store.put("k", state(1, 7))
    store.delete("k")
    assert store.get("k") is None


def test_a_state_read_is_decoded_once(decodes: list[bytes]) -> None:
    task = PartitionTask(A, LocalState())
    PartitionState(task).put("k", state(1, 7))
    store = PartitionState(task)
    assert store.get("k") == store.get("k") == state(1, 7)
    assert len(decodes) == 1


def test_past_its_limit_it_starts_over(
    decodes: list[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pairing_state, "RECENT_STATES", 2)
    store = PartitionState(PartitionTask(A, LocalState()))
    for n in range(3):
        store.put(f"k{n}", state(n, n))
    assert store.get("k2") == state(2, 2) and decodes == []  # kept: the newest
    assert store.get("k0") == state(0, 0) and len(decodes) == 1  # forgotten: read again
