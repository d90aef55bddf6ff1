from collections.abc import Iterator

from pairing.key_state import KeyState, KeyTimes, key_times


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

    def times(self) -> Iterator[KeyTimes]:
        return iter([key_times(key, state) for key, state in self.data.items()])
