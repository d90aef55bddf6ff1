"""Table writes reach the local RocksDB only once every transaction that carries them
has committed, with faust's persisted changelog offset; reads see them before that.
Real rocksdict databases, opened as faust opens them; the tables' stores are fakes
that hand them out per partition."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import rocksdict
from faust.stores.rocksdb import Store
from faust.types import TP

import delivery.store as deliveries
from app.exactly_once.local_state import LocalState
from app.exactly_once.partition_tasks import PartitionTask
from delivery.rules import Entry, Status, encode_entry
from tables import TableWriter

A, B = TP("keyed", 0), TP("other", 0)


class FakeStore:
    offset_key = Store.offset_key

    def __init__(self, path: Path) -> None:
        self._path = path
        self._dbs: dict[int, rocksdict.Rdict] = {}

    def _db_for_partition(self, partition: int) -> rocksdict.Rdict:
        if partition not in self._dbs:
            options = rocksdict.Options(raw_mode=True)
            self._dbs[partition] = rocksdict.Rdict(str(self._path / str(partition)), options)
        return self._dbs[partition]


def fake_table(path: Path, name: str = "state") -> Any:
    return SimpleNamespace(
        name=name,
        data=FakeStore(path),
        changelog_topic=SimpleNamespace(get_topic_name=lambda: "state-changelog"),
    )


def delivered(offset: int) -> asyncio.Future[Any]:
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    future.set_result(SimpleNamespace(offset=offset))
    return future


def step_sent(task: PartitionTask, first_offset: int) -> None:
    """The step's records, its changelog records last, are sent in one batch, acked at
    consecutive offsets from `first_offset` (the batch's future reports that one)."""
    task.writes.to_changelog(task.outbox)
    batch = delivered(first_offset)
    task.writes.sent([(batch, i) for i in range(len(task.outbox.records))])
    task.outbox.clear()


def db(table: Any) -> rocksdict.Rdict:
    return table.data._db_for_partition(0)


async def test_writes_reach_rocksdb_after_their_transaction_commits(tmp_path: Path) -> None:
    table, local_state = fake_table(tmp_path), LocalState()
    task = PartitionTask(A, local_state)
    writer = TableWriter(table, task)
    writer.put(b"k1", b"v1")
    writer.put(b"k2", b"v2")
    writer.delete(b"k2")
    assert writer.get(b"k1") == b"v1"  # the step sees its own writes
    assert writer.get(b"k2") is None
    assert task.outbox.records == []  # as the step ends: one record a key, its last value
    task.writes.to_changelog(task.outbox)
    assert task.outbox.records == [
        ("state-changelog", b"k1", b"v1", 0),
        ("state-changelog", b"k2", None, 0),
    ]
    task.outbox.clear()
    step_sent(task, first_offset=40)
    assert writer.get(b"k1") == b"v1"  # uncommitted, still seen by later steps
    assert db(table).get(b"k1") is None

    local_state.committed({B})  # another partition's transaction: not this one
    assert db(table).get(b"k1") is None

    local_state.committed({A})
    assert db(table).get(b"k1") == b"v1"
    assert db(table).get(b"k2") is None
    assert db(table).get(Store.offset_key) == b"41"  # the last changelog record's offset
    assert list(TableWriter(table, task).items()) == [(b"k1", b"v1")]


async def test_a_step_writing_two_tables_persists_each_ones_last_offset(tmp_path: Path) -> None:
    first, second = fake_table(tmp_path / "1", "first"), fake_table(tmp_path / "2", "second")
    local_state = LocalState()
    task = PartitionTask(A, local_state)
    TableWriter(first, task).put(b"a", b"1")
    TableWriter(second, task).put(b"b", b"2")
    TableWriter(first, task).put(b"a", b"3")
    step_sent(task, first_offset=10)  # first's a at 10, second's b at 11
    local_state.committed({A})
    assert (db(first).get(b"a"), db(first).get(Store.offset_key)) == (b"3", b"10")
    assert (db(second).get(b"b"), db(second).get(Store.offset_key)) == (b"2", b"11")


async def test_a_step_cut_off_leaves_nothing(tmp_path: Path) -> None:
    table, local_state = fake_table(tmp_path), LocalState()
    task = PartitionTask(A, local_state)
    writer = TableWriter(table, task)
    writer.put(b"k", b"v")
    task.writes.discard()
    task.outbox.clear()
    assert writer.get(b"k") is None
    local_state.committed({A})
    assert db(table).get(b"k") is None
    assert db(table).get(Store.offset_key) is None


async def test_a_partition_written_by_two_tasks_waits_for_both(tmp_path: Path) -> None:
    # Enrichment: the rows and the pairs of one partition write one table partition,
    # each into its own transaction; the later write of a key must win.
    table, local_state = fake_table(tmp_path), LocalState()
    first, second = PartitionTask(A, local_state), PartitionTask(B, local_state)
    TableWriter(table, first).put(b"w", b"waiting")
    step_sent(first, first_offset=7)
    TableWriter(table, second).delete(b"w")
    step_sent(second, first_offset=8)
    local_state.committed({A})
    assert db(table).get(b"w") is None and db(table).get(Store.offset_key) is None
    assert TableWriter(table, first).get(b"w") is None  # the delete, uncommitted
    local_state.committed({A, B})
    assert db(table).get(b"w") is None
    assert db(table).get(Store.offset_key) == b"8"


async def test_revocation_forgets_uncommitted_writes(tmp_path: Path) -> None:
    table, local_state = fake_table(tmp_path), LocalState()
    task = PartitionTask(A, local_state)
    writer = TableWriter(table, task)
    writer.put(b"k", b"v")
    step_sent(task, first_offset=0)
    local_state.revoked({A})
    assert writer.get(b"k") is None
    local_state.committed({A})
    assert db(table).get(b"k") is None


@pytest.mark.parametrize("failure", ["pending", "failed"])
async def test_no_persisted_offset_without_every_delivery(tmp_path: Path, failure: str) -> None:
    table, local_state = fake_table(tmp_path), LocalState()
    known, unknown = PartitionTask(A, local_state), PartitionTask(B, local_state)
    TableWriter(table, known).put(b"k", b"v")
    step_sent(known, first_offset=5)
    TableWriter(table, unknown).put(b"j", b"w")
    delivery: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    if failure == "failed":
        delivery.set_exception(RuntimeError("no ack"))
    unknown.writes.to_changelog(unknown.outbox)
    unknown.writes.sent([(delivery, 0)])
    local_state.committed({A, B})
    assert db(table).get(b"k") == b"v" and db(table).get(b"j") == b"w"
    # 5 is known, but the other record may come after it or before: behind is safe,
    # ahead would make the next restore skip records.
    assert db(table).get(Store.offset_key) is None


async def test_a_scan_sees_what_steps_staged(tmp_path: Path) -> None:
    table, local_state = fake_table(tmp_path), LocalState()
    task = PartitionTask(A, local_state)
    writer = TableWriter(table, task)
    writer.put(b"k", b"committed")
    step_sent(task, first_offset=0)
    local_state.committed({A})
    writer.put(b"k", b"staged")
    writer.put(b"j", b"new")
    assert sorted(writer.items()) == [(b"j", b"new"), (b"k", b"staged")]


async def test_the_catch_up_scan_sees_steps_held_while_a_transaction_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SendReceipt: the by-id and the log task of a partition write one store partition. A
    # log step held while the log's transaction commits leaves the outcome it applied
    # staged until the next transaction begins; the scan at the end of the catch-up
    # runs meanwhile, and must not take the message for one still being called.
    table, local_state = fake_table(tmp_path), LocalState()
    monkeypatch.setattr(deliveries, "table", table)
    by_id, log = PartitionTask(A, local_state), PartitionTask(B, local_state)
    queued = Entry(Status.QUEUED, 1, b"{}")
    calling = Entry(Status.CALLING, 1, b"{}", attempts=1)
    done = Entry(Status.DELIVERED, 1, None, attempts=1)
    TableWriter(table, by_id).put(b"m", encode_entry(queued))
    step_sent(by_id, first_offset=0)
    local_state.committed({A})
    TableWriter(table, log).put(b"m", encode_entry(calling))
    step_sent(log, first_offset=1)  # sent, uncommitted
    TableWriter(table, log).put(b"m", encode_entry(done))  # held: staged
    scanned = dict(deliveries.stored_entries(local_state, 0, [by_id.writes, log.writes]))
    assert scanned == {"m": done}
    # Without the staged writes, the scan took it for a call the API may have had.
    assert dict(deliveries.stored_entries(local_state, 0, [])) == {"m": calling}
