"""A bounded memory of decoded states, shared by the stores that keep one."""

from __future__ import annotations

from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


def remember(recent: dict[K, V], key: K, value: V, limit: int) -> None:
    """`value` under `key`; once `limit` are held, a new key empties the memory first:
    O(1) an entry, no order kept, and the next ones fill it again."""
    if len(recent) >= limit and key not in recent:
        recent.clear()
    recent[key] = value
