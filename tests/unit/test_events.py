from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pairing.events import (
    Event,
    Rejection,
    add_exact,
    fingerprint,
    format_time,
    parse_event,
    parse_number,
    parse_timestamp,
    read_event,
)
from pairing.grammar import Sizes, fixed_point, number, oversize, oversize_invalid, parse_day
from pairing.grammar import _parse_timestamp as general_parse_timestamp

MAX = 4096


def parse(raw: bytes | None) -> Event | Rejection:
    return parse_event(raw, MAX)


def ok(raw: bytes) -> Event:
    result = parse(raw)
    assert isinstance(result, Event), result
    return result


def rejected(raw: bytes | None) -> str:
    result = parse(raw)
    assert isinstance(result, Rejection), result
    return result.reason


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("2024-02-09 21:00:00", "2024-02-09T21:00:00Z"),
        ("2024-02-09T21:00:00", "2024-02-09T21:00:00Z"),
        ("2024-02-09T21:00:00Z", "2024-02-09T21:00:00Z"),
        ("2024-02-09T22:00:00+01:00", "2024-02-09T21:00:00Z"),
        ("2024-02-09T16:30:00-0430", "2024-02-09T21:00:00Z"),
        ("2024-02-09T21:00:00.5Z", "2024-02-09T21:00:00.500000Z"),
        ("2024-02-09T21:00:00.123456789Z", "2024-02-09T21:00:00.123456Z"),
        ("2024-02-09T21:00:00.000Z", "2024-02-09T21:00:00Z"),
    ],
)
def test_timestamps_normalise_to_one_utc_key(text: str, key: str) -> None:
    event = ok(b'{"type":"A","timestamp":"%s","value":1}' % text.encode())
    assert event.key == key


@given(st.datetimes(timezones=st.just(UTC)), st.sampled_from(["Z", "", "+00:00"]), st.booleans())
def test_a_utc_key_is_what_format_time_writes(moment: datetime, zone: str, space: bool) -> None:
    date = f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d}"
    text = date + (" " if space else "T") + moment.strftime("%H:%M:%S")
    if moment.microsecond:
        text += moment.strftime(".%f")
    parsed = parse_timestamp(text + zone)
    assert not isinstance(parsed, Rejection)
    assert parsed[0] == format_time(moment)
    assert parsed[1] == (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    # The same instant an hour ahead, with its offset: the general path agrees.
    ahead = moment + timedelta(hours=1)
    if moment.year >= 1000 and ahead.year <= 9999:
        shifted = ahead.replace(tzinfo=None).isoformat(timespec="microseconds") + "+01:00"
        assert parse_timestamp(shifted) == parsed


def test_time_us_counts_from_epoch() -> None:
    assert ok(b'{"type":"B","timestamp":"1970-01-01 00:00:01.25","value":1}').time_us == 1_250_000


def test_integers_stay_integers_and_decimals_stay_exact() -> None:
    a = ok(b'{"type":"A","timestamp":"2024-02-09 21:00:00","value":0.1}')
    b = ok(b'{"type":"B","timestamp":"2024-02-09 21:00:00","value":0.2}')
    assert add_exact(a.value, b.value) == Decimal("0.3")
    assert str(add_exact(a.value, b.value)) == "0.3"
    assert add_exact(2, 3) == 5 and isinstance(add_exact(2, 3), int)
    big = Decimal("12345678901234567890.123456789012345678901234567890")
    assert add_exact(big, big) == Decimal("24691357802469135780.246913578024691357802469135780")


def test_identity_is_id_when_given_else_fingerprint() -> None:
    with_id = ok(b'{"type":"A","timestamp":"2024-02-09 21:00:00","value":1,"id":"x-1"}')
    assert with_id.identity == "x-1"
    numeric_id = ok(b'{"type":"A","timestamp":"2024-02-09 21:00:00","value":1,"id":7}')
    assert numeric_id.identity == "7"
    plain = ok(b'{"type":"A","timestamp":"2024-02-09 21:00:00","value":1.0}')
    same = ok(b'{"value":1,"timestamp":"2024-02-09T21:00:00Z","type":"A"}')
    assert plain.identity == same.identity == fingerprint("A", plain.key, 1)
    other_type = ok(b'{"type":"B","timestamp":"2024-02-09 21:00:00","value":1}')
    assert other_type.identity != plain.identity


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (None, "null value"),
        (b"", "empty record"),
        (b"{not json", "malformed JSON"),
        (b"\xff\xfe", "malformed JSON"),
        (b"[1,2]", "not a JSON object"),
        (b'"A"', "not a JSON object"),
        (b"null", "not a JSON object"),
        (b'{"timestamp":"2024-02-09 21:00:00","value":1}', "missing field 'type'"),
        (b'{"type":"C","timestamp":"2024-02-09 21:00:00","value":1}', "unknown type 'C'"),
        (b'{"type":"a","timestamp":"2024-02-09 21:00:00","value":1}', "unknown type 'a'"),
        (b'{"type":"A","value":1}', "missing field 'timestamp'"),
        (b'{"type":"A","timestamp":12,"value":1}', "not a string"),
        (b'{"type":"A","timestamp":"yesterday","value":1}', "unparseable timestamp"),
        (b'{"type":"A","timestamp":"2024-02-30 21:00:00","value":1}', "unparseable timestamp"),
        (b'{"type":"A","timestamp":"2023-02-29 21:00:00","value":1}', "unparseable timestamp"),
        (b'{"type":"A","timestamp":"2024-13-09 21:00:00","value":1}', "unparseable timestamp"),
        (b'{"type":"A","timestamp":"2024-02-09 24:00:00Z","value":1}', "unparseable timestamp"),
        (b'{"type":"A","timestamp":"2024-02-09 21:60:00","value":1}', "unparseable timestamp"),
        (b'{"type":"A","timestamp":"2024-02-09 23:59:60","value":1}', "unparseable timestamp"),
        (b'{"type":"A","timestamp":"0000-02-09 21:00:00","value":1}', "unparseable timestamp"),
        (b'{"type":"A","timestamp":"2024-02-09","value":1}', "unparseable timestamp"),
        (b'{"type":"A","timestamp":"2024-02-09 21:00:00"}', "missing field 'value'"),
        (b'{"type":"A","timestamp":"2024-02-09 21:00:00","value":"1"}', "not a number"),
        (b'{"type":"A","timestamp":"2024-02-09 21:00:00","value":true}', "not a number"),
        (b'{"type":"A","timestamp":"2024-02-09 21:00:00","value":null}', "not a number"),
        (b'{"type":"A","timestamp":"2024-02-09 21:00:00","value":NaN}', "not a finite number"),
        (b'{"type":"A","timestamp":"2024-02-09 21:00:00","value":Infinity}', "not a finite"),
        (b'{"type":"A","timestamp":"2024-02-09 21:00:00","value":-Infinity}', "not a finite"),
        (b'{"type":"A","timestamp":"2024-02-09 21:00:00","value":1e999999}', "out of range"),
        (b'{"type":"A","timestamp":"2024-02-09 21:00:00","value":1,"id":[1]}', "'id' must be"),
        (b'{"type":"A","timestamp":"2024-02-09 21:00:00","value":1,"id":""}', "'id' must have"),
    ],
)
def test_invalid_records_are_rejected_with_a_reason(raw: bytes | None, reason: str) -> None:
    assert reason in rejected(raw)


def test_oversize_records_are_rejected_before_parsing() -> None:
    raw = b'{"type":"A","timestamp":"2024-02-09 21:00:00","value":1,"pad":"' + b"x" * MAX + b'"}'
    assert "oversize" in rejected(raw)


@given(
    st.one_of(
        st.integers(),
        st.decimals(allow_nan=False, allow_infinity=False),
    )
)
def test_a_number_written_with_str_reads_back_as_the_same_value(value: int | Decimal) -> None:
    text = str(value)
    read = parse_number(text)
    assert read == value
    # An int stays an int; a Decimal spelled with a point or an exponent stays a Decimal
    # (one spelled as digits only, like "12", reads as the int it equals).
    assert isinstance(read, int) == (isinstance(value, int) or text.lstrip("-").isdigit())


def test_what_is_not_a_number_is_refused() -> None:
    for text in ("", "1.2.3", "abc", "1e", "NaN!"):
        with pytest.raises(ValueError):
            parse_number(text)


@pytest.mark.parametrize(
    ("number", "in_range"),
    [
        ("9" * 100, True),
        ("-" + "9" * 100, True),
        ("1" + "0" * 100, False),  # 101 digits
        ("0." + "1" * 100, True),
        ("0." + "1" * 101, False),
        ("1" * 50 + "." + "1" * 51, False),
        ("1e300", True),
        ("1e301", False),
        ("1.5e-300", True),
        ("1e-301", False),
        ("0.5", True),  # a short record: its digits are not counted
    ],
)
def test_values_are_bounded_in_digits_and_magnitude(number: str, in_range: bool) -> None:
    raw = b'{"type":"A","timestamp":"2024-02-09 21:00:00","value":' + number.encode() + b"}"
    result = parse(raw)
    assert isinstance(result, Event) == in_range, result
    if not in_range:
        assert isinstance(result, Rejection) and "out of range" in result.reason


_SHAPE = "0123456789-:T +Z.x\u0663"  # digits, the separators, and characters near them


@given(
    st.one_of(
        st.datetimes().map(lambda moment: moment.isoformat(sep=" ", timespec="seconds")),
        st.text(alphabet=_SHAPE, min_size=19, max_size=19),
        st.datetimes()
        .map(lambda moment: moment.isoformat(timespec="seconds"))
        .flatmap(
            lambda text: st.integers(0, 18).flatmap(
                lambda at: st.sampled_from(_SHAPE).map(lambda c: text[:at] + c + text[at + 1 :])
            )
        ),
    )
)
def test_plain_timestamps_read_as_the_general_way_reads_them(text: str) -> None:
    assert parse_timestamp(text) == general_parse_timestamp(text)


@pytest.mark.parametrize(
    ("value", "fits"),
    [
        (Decimal("12.34"), True),
        (7, True),
        (Decimal("-99999999999999999999.999999999999999999"), True),  # 20 + 18 digits
        (Decimal("1E+2"), True),
        (Decimal(0), True),
        (Decimal("100000000000000000000"), False),  # 21 integer digits
        (Decimal("1000000000000000000000000000012.34"), False),
        (Decimal("0.1234567890123456789012"), False),  # 22 places: never rounded
        (Decimal("1e-300"), False),
        (int("9" * 100), False),
    ],
)
def test_a_fixed_point_holds_the_value_exactly_or_not_at_all(
    value: Decimal | int, fits: bool
) -> None:
    found = fixed_point(value, 20, 18)
    if fits:
        assert found == value and found is not None and found.as_tuple().exponent == -18
    else:
        assert found is None


def test_no_pattern_takes_a_trailing_newline() -> None:
    """Every pattern of the grammar ends its input (`\\Z`, or fullmatch): `$` would also
    match before a final newline."""
    for text in ("2024-03-01 10:01:40", "2024-03-01T10:01:40.5Z", "2024-03-01T10:01:40+01:00"):
        assert not isinstance(parse_timestamp(text), Rejection)
        for tail in ("\n", "\r\n", " "):
            assert isinstance(parse_timestamp(text + tail), Rejection), repr(text + tail)
    assert not isinstance(parse_day(b"2024-03-01"), Rejection)
    assert isinstance(parse_day(b"2024-03-01\n"), Rejection)
    assert not isinstance(number("12.5", "amount", text_too=True), Rejection)
    assert isinstance(number("12.5\n", "amount", text_too=True), Rejection)


def test_keys_have_four_digit_years() -> None:
    assert parse_timestamp("0001-01-01 00:00:00") == ("0001-01-01T00:00:00Z", -62135596800000000)
    assert parse_timestamp("0999-03-01T10:00:00.5Z")[0] == "0999-03-01T10:00:00.500000Z"  # type: ignore[index]
    assert format_time(datetime(1, 1, 1, tzinfo=UTC)) == "0001-01-01T00:00:00Z"


def test_a_utf16_document_is_refused_as_not_utf8() -> None:
    for encoding in ("utf-16-le", "utf-16-be", "utf-32-le", "utf-16"):
        raw = '{"type":"A","timestamp":"2024-02-09 21:00:00","value":1}'.encode(encoding)
        result = parse_event(raw, 65536)
        assert isinstance(result, Rejection) and result.reason.startswith(
            "malformed JSON: not UTF-8"
        ), encoding


def test_sizes_are_read_before_anything_else() -> None:
    valid = b'{"type":"A","timestamp":"2024-02-09 21:00:00","value":1}'  # 56 bytes
    sizes = Sizes(key_bytes=4, value_bytes=len(valid))
    assert oversize(b"1234", valid, sizes) is None
    assert oversize(b"12345", valid, sizes) == Rejection("oversize key: 5 bytes > 4")
    assert oversize(None, valid + b" ", sizes) == Rejection("oversize record: 57 bytes > 56")
    assert oversize_invalid(b"12345", None, sizes) == "invalid: oversize key: 5 bytes > 4"
    at = 1_707_512_400_000  # the record's timestamp: 2024-02-09 21:00:00
    assert isinstance(read_event(b"12345", valid, at, sizes, None), Rejection)
    assert isinstance(read_event(b"1234", valid, at, sizes, None), Event)


def test_the_clock_guard_measures_against_the_record_s_timestamp() -> None:
    at = 1_707_512_400_000  # 2024-02-09 21:00:00
    event = b'{"type":"A","timestamp":"2024-02-09 21:01:00","value":1}'
    sizes = Sizes()
    assert isinstance(read_event(None, event, at, sizes, 60_000_000), Event)  # 60 s: in
    late_record = read_event(None, event, at - 1, sizes, 60_000_000)
    assert isinstance(late_record, Rejection)
    assert late_record.reason == (
        "timestamp too far in the future: 2024-02-09T21:01:00Z is 60.001 s after its record's"
        " timestamp, more than 60 s"
    )
    assert isinstance(read_event(None, event, at - 10**9, sizes, None), Event)  # no guard
    past = b'{"type":"A","timestamp":"2001-01-01 00:00:00","value":1}'
    assert isinstance(read_event(None, past, at, sizes, 60_000_000), Event)  # replays
