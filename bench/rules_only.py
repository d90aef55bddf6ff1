"""The floor under any hot path over these rules: the same workload through the pure
parts alone, in one process with no Kafka and no faust. Ingest's parse and re-keyed
record, then per keyed partition the record's decode, the rule engine over key states
in RocksDB (read and written with the same codecs as the worker's table), and the
output records. As in a worker: runs of `max_run_records`, one pair time per run, a
run's key states written in one RocksDB write batch, the worker's collector
thresholds with what came before frozen. Whatever a worker adds (fetching,
transactions, changelog sends, steps) comes on top of this."""

from __future__ import annotations

import gc
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import cast

from rocksdict import Options, Rdict, WriteBatch

from app.settings import settings
from pairing.events import Rejection, format_time, read_event
from pairing.key_state import Conflict, KeyState, KeyTimes, Paired, Unpaired
from pairing.records import (
    Source,
    dead_letter,
    decode_key_times,
    decode_keyed_event,
    decode_state,
    encode_keyed_event,
    encode_state,
    pair_record,
    unpaired_record,
)
from pairing.routing import partition_for
from pairing.rules import PairingPartition
from pairing.watermarks import EventClock, SourceProgress
from tools.generate import Record

INPUT_TOPIC = "events"


@dataclass(frozen=True)
class RulesOnlyResult:
    events: int
    pairs: int
    cpu_seconds: float  # this process, both stages
    ingest_cpu_seconds: float

    @property
    def micros_per_event(self) -> float:
        return self.cpu_seconds * 1e6 / self.events

    @property
    def rate(self) -> float:
        """Events/s one core could do if this were all a worker did."""
        return self.events / self.cpu_seconds


class RocksKeyStore:
    """A keyed partition's key states in RocksDB, encoded as the worker's table holds
    them; writes are staged until `write`, as a worker's until its commit."""

    def __init__(self, path: str) -> None:
        self._db = Rdict(path, options=Options(raw_mode=True))
        self._staged: dict[bytes, bytes | None] = {}  # None: deleted

    def get(self, key: str) -> KeyState | None:
        raw_key = key.encode()
        raw = self._staged[raw_key] if raw_key in self._staged else self._db.get(raw_key)
        return None if raw is None else decode_state(raw)

    def put(self, key: str, state: KeyState) -> None:
        self._staged[key.encode()] = encode_state(state)

    def delete(self, key: str) -> None:
        self._staged[key.encode()] = None

    def write(self) -> None:
        batch = WriteBatch(raw_mode=True)
        for key, value in self._staged.items():
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        self._db.write(batch)
        self._staged.clear()

    def times(self) -> Iterator[KeyTimes]:
        for raw_key, raw_value in self._db.items():  # raw mode: both are bytes
            yield decode_key_times(cast(bytes, raw_key).decode(), cast(bytes, raw_value))

    def close(self) -> None:
        self._db.close()


def ingest(
    records: list[Record], input_partitions: int, keyed_partitions: int
) -> list[list[bytes]]:
    """The re-keyed records of each keyed partition, in order."""
    conf = settings()
    sources = [SourceProgress(None, 0.0) for _ in range(input_partitions)]
    offsets = [0] * input_partitions
    keyed: list[list[bytes]] = [[] for _ in range(keyed_partitions)]
    for n, (_, raw) in enumerate(records):
        partition = n % input_partitions  # random producer keys spread evenly
        source = Source(INPUT_TOPIC, partition, offsets[partition])
        offsets[partition] += 1
        parsed = read_event(None, raw, int(time.time() * 1000), conf.sizes, conf.max_ahead_us)
        if isinstance(parsed, Rejection):
            dead_letter(parsed.reason, None, raw, source, conf.sizes)
            continue
        assert raw is not None  # a valid event has a body
        stamp = sources[partition].observe(parsed.time_us, time.time())
        record = encode_keyed_event(parsed, raw, source, stamp)
        keyed[partition_for(parsed.key, keyed_partitions)].append(record)
    return keyed


def pair(records: list[bytes], store: RocksKeyStore) -> int:
    """Run one keyed partition's records through the rules, run by run, making their
    output records; how many pairs."""
    conf = settings()
    engine = PairingPartition(store, conf.pairing, EventClock(), time.time())
    pairs = 0
    for start in range(0, len(records), conf.max_run_records):
        paired_at = format_time(datetime.now(UTC))
        now = time.time()
        for value in records[start : start + conf.max_run_records]:
            keyed = decode_keyed_event(value)
            for outcome in engine.process(keyed.event, keyed.progress_us, now):
                if isinstance(outcome, Paired):
                    pair_record(outcome, paired_at)
                    pairs += 1
                elif isinstance(outcome, Unpaired):
                    unpaired_record(outcome)
                elif isinstance(outcome, Conflict):
                    reason = f"conflict: {outcome.detail}"
                    dead_letter(
                        reason, None, keyed.raw, keyed.source, conf.sizes, outcome.event.identity
                    )
        store.write()
    return pairs


def run_rules_only(records: list[Record], input_partitions: int) -> RulesOnlyResult:
    conf = settings()
    keyed_partitions = conf.partitions
    thresholds = gc.get_threshold()
    gc.set_threshold(*conf.gc_thresholds)
    gc.freeze()  # the workload, as a worker's start
    try:
        started = time.process_time()
        keyed = ingest(records, input_partitions, keyed_partitions)
        ingested = time.process_time()
        pairs = 0
        with tempfile.TemporaryDirectory(prefix="bench-rules-") as root:
            for number, partition_records in enumerate(keyed):
                store = RocksKeyStore(f"{root}/{number}")
                try:
                    pairs += pair(partition_records, store)
                finally:
                    store.close()
        done = time.process_time()
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
    return RulesOnlyResult(len(records), pairs, done - started, ingested - started)
