"""Which offset a commit takes, given the records processed and the gaps between them."""

import pytest
from faust.types import TP

from app.exactly_once.offset_order import OffsetOrder, Verdict
from app.faust_app import app

pytestmark = pytest.mark.usefixtures("own_tasks")


def offsets_of(tp: TP) -> OffsetOrder:
    task = app.partition_tasks.get(tp)
    assert task is not None
    return task.offsets


def processed_from(tp: TP, committed: int, offsets: list[int]) -> None:
    """Set up what the consumer and the agents know after processing `offsets`."""
    app.consumer._committed_offset[tp] = committed
    app.partition_tasks.assigned({tp})
    progress = offsets_of(tp)
    progress.sought_to_committed(committed)
    for offset in offsets:
        progress.processed(offset)
        app.consumer._acked[tp].append(offset)


async def test_a_commit_passes_every_transaction_marker_before_the_last_processed_record() -> None:
    tp = TP("keyed", 0)
    # Records at 100, 102 and 104; 101 and 103 are transaction markers, never delivered.
    # faust's fetcher reports each gap with the record that ends it.
    await app.consumer._add_gap(tp, 101, 102)
    await app.consumer._add_gap(tp, 103, 104)
    processed_from(tp, 100, [100, 102, 104])
    assert app.consumer._new_offset(tp) == 105


async def test_a_record_delivered_and_not_yet_processed_holds_the_commit_before_it() -> None:
    tp = TP("keyed", 1)
    processed_from(tp, 10, [10])
    await app.consumer._add_gap(tp, 11, 12)  # record 12 comes after marker 11
    offsets_of(tp).skipped(12)  # delivered during a revocation, say: it comes again
    assert offsets_of(tp).verdict(13) is Verdict.OUT_OF_ORDER
    assert app.consumer._new_offset(tp) == 11


async def test_a_commit_never_passes_the_last_processed_record() -> None:
    tp = TP("keyed", 2)
    processed_from(tp, 50, [50, 51])
    app.consumer._acked[tp].extend([52, 53])  # acks no step of this assignment made
    assert app.consumer._new_offset(tp) == 52


async def test_records_processed_after_a_seek_back_over_a_gap_commit_as_they_are_processed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The zombie scenario's duplicated dead letters (CI, seed 44473891): after an
    # assignment, records 1191..1995 were fetched before the seek and dropped, so 1996
    # came first and faust's fetcher took 1192..1995 for a gap. The agent sought back
    # to 1191 and processed them; faust's commit offset then moved by one per commit
    # (1193 here), and the next owner processed some thousand records again.
    tp = TP("events", 3)

    async def seek(partition: TP, offset: int) -> None:
        pass  # the fetch itself is not under test

    monkeypatch.setattr(app.consumer, "seek", seek)
    app.consumer._committed_offset[tp] = 1191
    await app.consumer._add_gap(tp, 1192, 1996)
    await app.consumer.seek_back(tp, 1191)
    processed_from(tp, 1191, list(range(1191, 1301)))
    assert app.consumer._new_offset(tp) == 1301
    # and what faust keeps for its own answer is cleared below it, or never kept
    assert not app.consumer._acked[tp] and not app.consumer._acked_index[tp]
    assert not app.consumer._gap.get(tp)
