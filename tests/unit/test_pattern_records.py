"""The patterns' wire formats (pairing/pattern_records.py)."""

import json
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from pairing.pattern_records import (
    RoutedPatternEvent,
    decode_pattern_event,
    encode_pattern_event,
    match_record,
)
from pairing.pattern_state import Match, PatternEvent
from pairing.patterns import load_patterns
from pairing.records import Source

ROOT = Path(__file__).resolve().parents[2]

FIELD_VALUES = st.one_of(
    st.none(),
    st.text(max_size=20),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.decimals(allow_nan=False, allow_infinity=False, places=6),
)


@given(
    st.integers(min_value=0, max_value=2**62),
    st.text(min_size=1, max_size=20),
    st.dictionaries(st.text(max_size=10), FIELD_VALUES, max_size=5),
    st.one_of(st.none(), st.integers(min_value=0, max_value=2**50)),
)
def test_a_routed_event_reads_back_as_it_was_with_exact_numbers(
    time: int, identity: str, fields: dict[str, object], timestamp_ms: int | None
) -> None:
    routed = RoutedPatternEvent(
        PatternEvent(time, identity, fields),  # type: ignore[arg-type]
        "session",
        Source("clicks", 3, 17, timestamp_ms),
        time + 5,
    )
    back = decode_pattern_event(encode_pattern_event(routed))
    assert back == routed
    for name, value in fields.items():
        assert type(back.event.fields[name]) is type(value)
    assert encode_pattern_event(routed)[:1] == b"["  # a watermark record is an object


def test_a_match_names_each_step_s_events_and_its_times() -> None:
    inner, outer, _ = load_patterns(ROOT / "deploy" / "patterns" / "examples.toml").patterns
    paired = Match("search-click", "s1", (("q1",), ("c1",)), 0, 90_000_000, 90_000_000)
    assert json.loads(match_record(paired, inner)) == {
        "pattern": "search-click",
        "key": "s1",
        "steps": {"search": ["q1"], "click": ["c1"]},
        "first_time": "1970-01-01T00:00:00Z",
        "last_time": "1970-01-01T00:01:30Z",
        "decided_at": "1970-01-01T00:01:30Z",
    }
    # An absent step takes none; a window that ends past year 9999 has no calendar date.
    last_day = 253402300799_000_000  # 9999-12-31T23:59:59Z
    alone = Match(
        "search-without-click", "s1", (("q2",), ()), last_day, last_day, last_day + 3600_000_000
    )
    record = json.loads(match_record(alone, outer))
    assert record["steps"] == {"search": ["q2"], "click": []}
    assert (record["first_time"], record["decided_at"]) == (
        "9999-12-31T23:59:59Z",
        last_day + 3600_000_000,
    )
