"""The pure rules of once-only delivery (delivery/rules.py)."""

from __future__ import annotations

from delivery.rules import (
    Answer,
    Entry,
    LogRecord,
    Status,
    Verdict,
    apply,
    backoff,
    decode_entry,
    decode_log,
    encode_entry,
    encode_log,
    idempotency_key,
    identity,
    judge,
    parse_order,
    parse_retry_after,
    settle_remaining,
    uncertain_now,
)


def test_identity_is_the_id_field_else_a_fingerprint_of_the_bytes() -> None:
    assert identity(b'{"id": 7}', {"id": 7}, "id") == "id:7"
    assert identity(b'{"id": "a"}', {"id": "a"}, "id") == "id:a"
    fingerprint = identity(b'{"x": 1}', {"x": 1}, "id")
    assert fingerprint.startswith("sha256:")
    assert fingerprint != identity(b'{"x":1}', {"x": 1}, "id")  # bytes, not meaning
    for unusable in ("", None, True, [1], {"a": 1}):
        assert identity(b"{}", {"id": unusable}, "id").startswith("sha256:")


def test_idempotency_key_is_stable_per_message_and_namespaced() -> None:
    key = idempotency_key("app", "id:1")
    assert key == idempotency_key("app", "id:1")
    assert key != idempotency_key("app", "id:2")
    assert key != idempotency_key("other-app", "id:1")


def test_orders_that_cannot_be_delivered_say_why() -> None:
    assert str(parse_order(None)).startswith("invalid: empty record")
    assert parse_order(b"") == "invalid: empty record"
    assert str(parse_order(b"{nope")).startswith("invalid: malformed JSON")
    assert parse_order(b"\x80\xfe") == "invalid: malformed JSON: not UTF-8"
    assert parse_order(b"[1]") == "invalid: not a JSON object but list"
    assert parse_order(b'{"id": 1}') == {"id": 1}


def test_answers_are_judged_by_status() -> None:
    assert judge(Answer(200)) is Verdict.DELIVERED
    assert judge(Answer(201)) is Verdict.DELIVERED
    for status in (None, 408, 429, 500, 503):
        assert judge(Answer(status)) is Verdict.RETRY
    for status in (301, 400, 404, 409, 422):
        assert judge(Answer(status)) is Verdict.REJECTED


def test_backoff_grows_to_the_cap_and_honours_retry_after() -> None:
    assert backoff(1, 0.5, 30, None, 1.0) == 0.5
    assert backoff(3, 0.5, 30, None, 1.0) == 2.0
    assert backoff(3, 0.5, 30, None, 0.0) == 1.0  # jitter halves at most
    assert backoff(20, 0.5, 30, None, 1.0) == 30
    assert backoff(1, 0.5, 30, 7.0, 0.0) == 7.0
    assert backoff(1, 0.5, 30, 90.0, 0.0) == 30
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after("Wed, 21 Oct 2026 07:28:00 GMT") is None
    assert parse_retry_after("-1") is None
    assert parse_retry_after(None) is None


QUEUED = Entry(Status.QUEUED, 1000, b'{"id": 1}')


def test_a_call_goes_queued_calling_delivered_and_the_body_is_dropped() -> None:
    calling = apply(QUEUED, LogRecord("attempt", "id:1", 1, 0))
    assert calling is not None and calling.entry.status is Status.CALLING
    assert calling.outcome is None and uncertain_now(calling.entry)
    done = apply(calling.entry, LogRecord("outcome", "id:1", 1, 0, status=Status.DELIVERED))
    assert done is not None and done.outcome is Status.DELIVERED
    assert done.entry.body is None and done.entry.terminal
    # Anything after the outcome changes nothing.
    assert apply(done.entry, LogRecord("attempt", "id:1", 2, 0)) is None


def test_a_failed_attempt_is_queued_again_remembering_whether_the_api_may_have_it() -> None:
    calling = apply(QUEUED, LogRecord("attempt", "id:1", 1, 0))
    assert calling is not None
    maybe = apply(calling.entry, LogRecord("failed", "id:1", 1, 0, maybe_sent=True))
    assert maybe is not None and maybe.entry.status is Status.QUEUED
    assert uncertain_now(maybe.entry)
    refused = apply(calling.entry, LogRecord("failed", "id:1", 1, 0, maybe_sent=False))
    assert refused is not None and not uncertain_now(refused.entry)


def test_repeated_or_stale_log_records_change_nothing() -> None:
    calling = apply(QUEUED, LogRecord("attempt", "id:1", 1, 0))
    assert calling is not None
    assert apply(calling.entry, LogRecord("attempt", "id:1", 1, 0)) is None
    failed = apply(calling.entry, LogRecord("failed", "id:1", 1, 0))
    assert failed is not None
    # A repeated attempt record after its failure must not make it "calling" again.
    assert apply(failed.entry, LogRecord("attempt", "id:1", 1, 0)) is None
    assert apply(failed.entry, LogRecord("failed", "id:1", 1, 0)) is None
    assert apply(None, LogRecord("attempt", "id:1", 1, 0)) is None


def test_the_uncertain_count_only_grows() -> None:
    calling = apply(QUEUED, LogRecord("attempt", "id:1", 1, 2))
    assert calling is not None and calling.entry.uncertain == 2
    parked = apply(
        calling.entry, LogRecord("outcome", "id:1", 1, 1, status=Status.PARKED, reason="r")
    )
    assert parked is not None and parked.entry.uncertain == 2


def test_entries_and_log_records_survive_their_encoding() -> None:
    entry = Entry(
        Status.CALLING, 5, b"\x00\xffbody", attempts=2, uncertain=1, maybe_sent=True, called_ms=9
    )
    assert decode_entry(encode_entry(entry)) == entry
    final = Entry(Status.DEAD, 5, None, attempts=3)
    assert decode_entry(encode_entry(final)) == final
    for record in (
        LogRecord("attempt", "id:1", 1, 0, at_ms=1_700_000_000_123),
        LogRecord("failed", "sha256:ab", 2, 1, maybe_sent=True),
        LogRecord("outcome", "id:1", 3, 1, status=Status.DEAD, reason="rejected", http_status=422),
    ):
        assert decode_log(encode_log(record)) == record


def test_an_uncertain_message_is_looked_up_only_once_its_last_call_has_settled() -> None:
    # The attempt that may have reached the API says when it started; the store keeps it
    # for the next owner, and a later attempt moves it on.
    first = apply(QUEUED, LogRecord("attempt", "id:1", 1, 0, at_ms=50_000))
    assert first is not None and first.entry.called_ms == 50_000
    failed = apply(first.entry, LogRecord("failed", "id:1", 1, 0, maybe_sent=True))
    assert failed is not None and failed.entry.called_ms == 50_000
    second = apply(failed.entry, LogRecord("attempt", "id:1", 2, 1, at_ms=80_000))
    assert second is not None and second.entry.called_ms == 80_000
    # Settle 20 s from the call's start at 50 s.
    assert settle_remaining(50_000, 50_000, 20) == 20
    assert settle_remaining(50_000, 65_500, 20) == 4.5
    assert settle_remaining(50_000, 70_000, 20) == 0
    assert settle_remaining(50_000, 90_000, 20) == 0
    # Settle 0: looked up at once, as before the setting existed.
    assert settle_remaining(50_000, 50_000, 0) == 0
