from pairing.watermarks import EventClock, SourceProgress, WatermarkUpdate


def update(source: int, progress: int | None, idle: bool = False) -> WatermarkUpdate:
    return WatermarkUpdate(source, 3, progress, idle)


def test_no_watermark_until_every_partition_is_heard_from() -> None:
    clock = EventClock()
    assert not clock.observe(update(0, 50))
    assert not clock.observe(update(1, 40))
    assert clock.watermark_us is None
    assert clock.observe(update(2, 45))
    assert clock.watermark_us == 40  # the slowest


def test_idle_partitions_do_not_hold_it_back_and_all_idle_means_read_to_the_end() -> None:
    clock = EventClock()
    clock.observe(update(0, 50))
    clock.observe(update(1, None, idle=True))  # never written
    clock.observe(update(2, 20))
    assert clock.watermark_us == 20
    clock.observe(update(2, 20, idle=True))
    assert clock.watermark_us == 50
    clock.observe(update(0, 50, idle=True))
    assert clock.watermark_us == 50  # all idle: the largest progress


def test_it_never_moves_back_nor_does_a_partitions_progress() -> None:
    clock = EventClock()
    clock.observe(update(0, 50))
    clock.observe(update(1, 60))
    clock.observe(update(2, 70, idle=True))
    assert clock.watermark_us == 50
    clock.observe(update(0, 30))  # an older message about partition 0
    assert clock.marks[0].progress_us == 50
    clock.observe(update(2, 10))  # back from idle, far behind
    assert clock.watermark_us == 50
    clock.observe(update(1, None, idle=True))  # an idle mark keeps the progress known
    assert clock.marks[1].progress_us == 60


def test_a_partition_without_any_valid_event_holds_it_until_declared_idle() -> None:
    clock = EventClock()
    clock.observe(update(0, 50))
    clock.observe(update(1, 60))
    clock.observe(update(2, None))
    assert clock.watermark_us is None


def test_source_progress_stamps_announces_and_goes_idle() -> None:
    source = SourceProgress(None, now=100.0)
    assert source.must_announce and not source.untold()
    # Never had a valid event: idle once quiet for the timeout since the assignment.
    assert not source.goes_idle(100.0, 30.0)
    assert not source.goes_idle(129.0, 30.0) and source.goes_idle(130.0, 30.0)
    assert source.observe(20, now=101.0) == 20
    assert source.observe(10, now=102.0) == 20  # the stamp includes the event
    assert source.untold() and source.tell_due(102.0, every=1.0)
    source.told(102.0)
    assert not source.untold() and not source.must_announce
    # Moved again: told at most once per interval.
    source.observe(30, now=102.0)
    assert source.untold() and not source.tell_due(102.5, every=1.0)
    assert source.tell_due(103.0, every=1.0)
    source.told(103.0)
    assert not source.goes_idle(131.0, 30.0)
    assert source.goes_idle(132.0, 30.0)
    source.went_idle()
    assert source.must_announce and source.update(0, 1).idle
    assert not source.goes_idle(200.0, 30.0)  # already idle
    # Back from idle with an event: told at once, and told as not idle.
    source.observe(40, now=210.0)
    assert source.must_announce
    assert source.announcement(0, 1, now=210.0) == WatermarkUpdate(0, 1, 40, idle=False)
    assert not source.must_announce and not source.idle and not source.untold()


def test_quiet_time_counts_only_while_the_worker_looks() -> None:
    source = SourceProgress(10, now=100.0)
    for second in range(101, 120):  # a look a second: quiet all along
        source.look(float(second), every_s=1.0)
    assert source.goes_idle(130.0, 30.0)
    # The worker stood still from 119 to 140: the look at 140 restarts the quiet clock,
    # and the source is idle only 30 s of looks later.
    source.look(140.0, every_s=1.0)
    assert not source.goes_idle(140.0, 30.0)
    for second in range(141, 170):
        source.look(float(second), every_s=1.0)
        assert not source.goes_idle(float(second), 30.0)
    source.look(170.0, every_s=1.0)
    assert source.goes_idle(170.0, 30.0)
    # A look late by up to twice its interval (a busy event loop) is no stall.
    late = SourceProgress(10, now=100.0)
    late.look(102.0, every_s=1.0)
    assert late.goes_idle(130.0, 30.0)


def test_an_idle_source_handed_over_holds_the_watermark_again() -> None:
    source = SourceProgress(None, now=100.0)
    assert not source.handed_over()  # not idle: nothing to take back
    source.went_idle()
    clock = EventClock()
    clock.observe(update(0, 50))
    clock.observe(update(1, 60))
    clock.observe(source.update(2, 3))
    assert clock.watermark_us == 50
    assert source.handed_over() and not source.idle
    clock.observe(source.update(2, 3))  # never written, not idle: unknown progress
    clock.observe(update(0, 90))
    clock.observe(update(1, 95))
    assert clock.watermark_us == 50  # held until partition 2 is heard from or idle again


def test_partitions_added_to_the_input_hold_it_until_heard_from() -> None:
    clock = EventClock()
    for source in range(3):
        clock.observe(update(source, 50 + source))
    assert clock.watermark_us == 50
    # The input grows to 5: a tell that says so, with no progress, changes nothing
    # known, and the new sources hold the watermark until they are heard from.
    assert not clock.observe(WatermarkUpdate(1, 5, None, False))
    assert clock.marks[1].progress_us == 51
    assert not clock.observe(update(0, 90))
    assert not clock.observe(update(1, 90))
    assert not clock.observe(update(2, 90))
    assert clock.watermark_us == 50
    assert not clock.observe(WatermarkUpdate(3, 5, 60, False))
    assert clock.observe(WatermarkUpdate(4, 5, None, True))  # never written: idle
    assert clock.watermark_us == 60


def test_a_source_heard_from_counts_even_when_its_owner_saw_fewer_partitions() -> None:
    clock = EventClock()
    for source in range(3):
        clock.observe(update(source, 50))
    clock.observe(WatermarkUpdate(3, 3, 20, False))  # an owner not yet told of the growth
    assert clock.sources == 4
    assert not clock.observe(update(0, 90))
    assert not clock.observe(update(1, 90))
    assert not clock.observe(update(2, 90))
    assert clock.watermark_us == 50  # held by source 3 (at 20)
    assert clock.observe(WatermarkUpdate(3, 3, 95, False))
    assert clock.watermark_us == 90
