"""Where each Delta table and checkpoint lives, under settings.lake_dir."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app.settings import Settings


@dataclass(frozen=True)
class Lake:
    root: Path

    @classmethod
    def of(cls, conf: Settings) -> Lake:
        return cls(conf.lake_dir)

    def bronze(self, source: str) -> str:
        """Kafka records of one topic, as read: topic, partition, offset, key, value."""
        return str(self.root / "bronze" / source)

    def checkpoint(self, source: str) -> str:
        return str(self.root / "checkpoints" / source)

    @property
    def progress(self) -> str:
        """The pairing group's committed offsets, taken before each ingest."""
        return str(self.root / "bronze" / "progress")

    def silver(self, name: str) -> str:
        """A table kept current from a topic (the events table's replica)."""
        return str(self.root / "silver" / name)

    def gold(self, name: str) -> str:
        return str(self.root / "gold" / name)

    @property
    def chart(self) -> Path:
        return self.root / "charts" / "per-minute.png"
