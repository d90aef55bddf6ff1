"""Which delivered records an agent processes, in what order, and when it seeks back."""

from app.exactly_once.offset_order import OffsetOrder, Verdict


def test_nothing_is_processed_before_the_seek_to_the_committed_offset() -> None:
    progress = OffsetOrder()
    assert progress.verdict(100) is Verdict.UNSOUGHT
    progress.skipped(100)
    progress.sought_to_committed(100)
    assert progress.verdict(100) is Verdict.PROCESS


def test_records_from_before_the_seek_cannot_jump_over_skipped_ones() -> None:
    # 100..102 arrived before the seek and were skipped; 103, fetched before the seek
    # too, arrives after it. Processing 103 would let the commit pass 100..102.
    progress = OffsetOrder()
    for offset in (100, 101, 102):
        progress.skipped(offset)
    progress.sought_to_committed(100)
    assert progress.verdict(103) is Verdict.OUT_OF_ORDER
    progress.skipped(103)
    for offset in (100, 101, 102, 103):
        assert progress.verdict(offset) is Verdict.PROCESS
        progress.processed(offset)
    assert progress.unprocessed == set()


def test_offsets_never_delivered_are_jumped() -> None:
    # Transaction markers and aborted records never reach an agent.
    progress = OffsetOrder()
    progress.sought_to_committed(100)
    assert progress.verdict(101) is Verdict.PROCESS  # 100: the marker after the last commit
    progress.processed(101)
    assert progress.verdict(140) is Verdict.PROCESS  # 102..139: an aborted transaction
    progress.processed(140)


def test_a_record_delivered_again_is_not_processed_again() -> None:
    progress = OffsetOrder()
    progress.sought_to_committed(100)
    progress.processed(100)
    progress.processed(101)
    assert progress.verdict(101) is Verdict.REDELIVERED
    assert progress.verdict(99) is Verdict.REDELIVERED


def test_a_later_seek_to_the_committed_offset_does_not_reprocess() -> None:
    # faust seeks to the committed offsets again when it finds its flow stopped; what
    # was processed since the last commit is delivered again and must be skipped.
    progress = OffsetOrder()
    progress.sought_to_committed(100)
    for offset in range(100, 110):
        progress.processed(offset)
    progress.sought_to_committed(100)
    assert progress.verdict(105) is Verdict.REDELIVERED
    assert progress.verdict(110) is Verdict.PROCESS


def test_skips_below_the_committed_offset_are_forgotten_at_the_seek() -> None:
    progress = OffsetOrder()
    progress.skipped(90)  # below what the group committed: some transaction holds it
    progress.sought_to_committed(100)
    assert progress.verdict(100) is Verdict.PROCESS


def test_only_the_first_record_after_a_seek_is_checked_for_a_jump() -> None:
    progress = OffsetOrder()
    progress.sought_to_committed(100)
    assert not progress.jumps_from_seek(100)
    assert not progress.jumps_from_seek(101)  # the marker the last commit left
    assert progress.jumps_from_seek(130)  # records thrown away unseen, or an aborted run
    progress.processed(130)
    assert not progress.jumps_from_seek(160)  # mid-stream gaps are markers and aborts
    progress.sought_to_committed(100)
    assert progress.jumps_from_seek(170)
