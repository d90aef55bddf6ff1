"""Read the output topics to their end with read_committed.

python -m tools.read_outputs            counts per topic and reason
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from app.settings import Settings, settings
from pairing.records import loads


@dataclass
class Outputs:
    pairs: list[dict[str, Any]] = field(default_factory=list)
    unpaired: list[dict[str, Any]] = field(default_factory=list)
    dead_letters: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> dict[str, int]:
        counts: Counter[str] = Counter()
        counts["pairs"] = len(self.pairs)
        for record in self.unpaired:
            counts[f"unpaired {record['reason']}"] += 1
        for record in self.dead_letters:
            kind = "conflict" if record["reason"].startswith("conflict") else "invalid"
            counts[f"dead letter {kind}"] += 1
        return dict(counts)


class OutputReader:
    """Reads pairs, unpaired and dead letters with read_committed, incrementally."""

    def __init__(self, conf: Settings) -> None:
        self.conf = conf
        self.outputs = Outputs()
        self._consumer = AIOKafkaConsumer(
            **conf.kafka.aiokafka(),
            isolation_level="read_committed",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        self._by_topic = {
            conf.pairs_topic: self.outputs.pairs,
            conf.unpaired_topic: self.outputs.unpaired,
            conf.dead_letter_topic: self.outputs.dead_letters,
        }

    async def __aenter__(self) -> OutputReader:
        await self._consumer.start()
        partitions: list[TopicPartition] = []
        for topic in self._by_topic:
            found = await self._partitions(topic)
            partitions.extend(TopicPartition(topic, p) for p in found)
        self._consumer.assign(partitions)
        await self._consumer.seek_to_beginning(*partitions)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._consumer.stop()

    async def _partitions(self, topic: str) -> set[int]:
        for _ in range(20):
            found: set[int] | None = self._consumer.partitions_for_topic(topic)
            if found:
                return found
            await self._consumer._client.force_metadata_update()
        raise RuntimeError(f"topic {topic} not found")

    async def poll(self) -> int:
        """One fetch of committed outputs; how many records it brought."""
        batch = await self._consumer.getmany(timeout_ms=500, max_records=10_000)
        for tp, messages in batch.items():
            self._by_topic[tp.topic].extend(loads(m.value) for m in messages)
        return sum(len(messages) for messages in batch.values())

    async def read_available(self) -> Outputs:
        """Read what is committed now: up to the last stable offsets as of the call,
        or until a poll comes back empty. The bound matters while workers keep
        committing: "until empty" alone may not end before the stream does."""
        ends = await self._consumer.end_offsets(list(self._consumer.assignment()))
        while await self.poll() and not await self._reached(ends):
            pass
        return self.outputs

    async def _reached(self, ends: dict[TopicPartition, int]) -> bool:
        for tp, end in ends.items():
            if await self._consumer.position(tp) < end:
                return False
        return True

    @property
    def total(self) -> int:
        return sum(len(records) for records in self._by_topic.values())


async def read_outputs(conf: Settings) -> Outputs:
    async with OutputReader(conf) as reader:
        return await reader.read_available()


def main() -> None:
    outputs = asyncio.run(read_outputs(settings()))
    print(json.dumps(outputs.summary(), indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
