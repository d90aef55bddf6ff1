"""`@immutable` values compare and hash as the frozen dataclasses they replace."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pairing.immutable import immutable


@immutable
class Fast:
    a: int
    b: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Frozen:
    a: int
    b: tuple[str, ...] = ()


@immutable
class Other:
    a: int
    b: tuple[str, ...] = ()


def test_equality_and_hash_are_those_of_a_frozen_dataclass() -> None:
    assert Fast(1, ("x",)) == Fast(1, ("x",)) and Fast(1) != Fast(2)
    assert Fast(1) != Other(1)  # another class with the same fields is another value
    assert hash(Fast(1, ("x",))) == hash(Frozen(1, ("x",))) == hash(Fast(1, ("x",)))
    assert len({Fast(1), Fast(1), Fast(2)}) == 2
    assert repr(Fast(1)) == "Fast(a=1, b=())"


def test_no_field_but_those_declared() -> None:
    value = Fast(1)
    with pytest.raises(AttributeError):
        value.c = 3  # type: ignore[attr-defined]
    assert not hasattr(value, "__dict__")
