"""The fault matrix's check of the committed pairing state: no key state built on an
older one than the last committed (tests/integration/scenarios.py)."""

from __future__ import annotations

from pairing.key_state import KeyState
from pairing.records import CLOCK_KEY, encode_state
from tests.integration.scenarios import forgotten_events


def state(*seen: str) -> bytes:
    return encode_state(KeyState(1_000, seen))


def test_a_state_that_leaves_out_an_event_seen_before_is_found() -> None:
    changelog = [
        [
            (b"k1", state("A-1")),
            (CLOCK_KEY, b"{}"),  # the event clock is not a key state
            (b"k1", state("A-1", "B-1")),
            (b"k1", None),  # forgotten by the rules: a new start
            (b"k1", state("A-2")),
        ],
        [
            (b"k2", state("A-3")),
            (b"k3", state("B-4")),
            (b"k2", state("B-5")),  # built on a state before A-3's
        ],
    ]
    assert forgotten_events(changelog) == [(1, 2, "k2")]
    assert forgotten_events(changelog[:1]) == []
