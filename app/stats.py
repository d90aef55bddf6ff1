"""Counters of what the agents did, per process."""

from __future__ import annotations

from collections import Counter


class Stats:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def count(self, name: str, n: int = 1) -> None:
        self.counts[name] += n


stats = Stats()
