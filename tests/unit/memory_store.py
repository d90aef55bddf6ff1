from collections.abc import Iterator

from pairing.rules import KeyState


class MemoryStore:
    """A dict behind the KeyStore protocol."""

    def __init__(self) -> None:
        self.data: dict[str, KeyState] = {}

    def get(self, key: str) -> KeyState | None:
        return self.data.get(key)

    def put(self, key: str, state: KeyState) -> None:
        self.data[key] = state

    def delete(self, key: str) -> None:
        del self.data[key]

    def items(self) -> Iterator[tuple[str, KeyState]]:
        return iter(list(self.data.items()))
