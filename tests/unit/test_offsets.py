"""Which offset a commit takes, given the records processed and the gaps between them."""

from faust.types import TP

from app.faust_app import app

KEYED = TP("keyed", 0)


async def test_a_commit_passes_every_transaction_marker_before_the_last_processed_record() -> None:
    consumer = app.consumer
    consumer._committed_offset[KEYED] = 100
    # Records at 100, 102 and 104; 101 and 103 are transaction markers. faust's
    # fetcher reports each gap as it meets the record that ends it.
    for record in (100, 102, 104):
        if record > 100:
            await consumer._add_gap(KEYED, record - 1, record)
        consumer._acked[KEYED].append(record)
    assert consumer._new_offset(KEYED) == 105


async def test_a_record_that_ends_a_gap_is_not_committed_before_it_is_processed() -> None:
    consumer = app.consumer
    tp = TP("keyed", 1)
    consumer._committed_offset[tp] = 10
    consumer._acked[tp].append(10)
    await consumer._add_gap(tp, 11, 12)  # record 12 arrives after marker 11, not yet processed
    consumer._acked[tp].append(13)  # ...while 13 is acked: 12 must hold the commit back
    assert consumer._new_offset(tp) == 12
