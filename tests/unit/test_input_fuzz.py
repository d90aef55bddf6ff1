"""Fuzzing of the pure handlers each input topic's agent calls (docs/grammar.md):
arbitrary bytes, arbitrary JSON and near-valid records (the right shape, wrong values).
Every record is processed or rejected with a reason, nothing raises, and where a model
exists (tests/reference_model.py, tools/deposits.expected) it agrees."""

from __future__ import annotations

import json
import random
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from delivery.rules import identity, parse_order
from pairing import deposits as rules
from pairing.changes import parse_change
from pairing.deposits import Account, Deposit, Totals
from pairing.enrichment import Enricher, enriched_record, row_rejection
from pairing.events import Rejection, parse_event, read_event
from pairing.grammar import MAX_DIGITS, MAX_EXPONENT, OUT_OF_RANGE, Sizes, oversize
from pairing.records import Source, dead_letter, decode_keyed_event, encode_keyed_event
from tests.reference_model import AmbiguousStream
from tests.unit.simulation import Simulation
from tests.unit.test_event_time import CONFIG, READING, model, outputs
from tools.deposits import expected

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MAX_BYTES = 65536

# --- what the records are made of ---------------------------------------------------

# JSON text of values that are almost numbers, or numbers at and past the bound.
NUMBER_TOKENS = [
    "1e999999999",
    "-1e999999999",
    "1e-999999999",
    "0e-999999999",
    "9" * 400,
    "0." + "1" * 400,
    "1" * 400 + ".5",
    "9" * MAX_DIGITS,
    "1e300",
    "1e-300",
    "1e30",
    "12.34",
    "-0",
    "0",
    "0.10",
    "1E+2",
    "NaN",
    "Infinity",
    "-Infinity",
    '"NaN"',
    '"nan"',
    '"Infinity"',
    '"inf"',
    '"1_000"',
    '" 1"',
    '"1 "',
    '"+1"',
    '"\u0661\u0662"',  # Arabic-Indic digits
    '"\uff11"',  # a fullwidth 1
    '"1e5"',
    '"0x10"',
    '".5"',
    '"5."',
    '"007"',
    '"12.50"',
    '"' + "9" * 400 + '"',
    "true",
    "null",
    "[]",
    "{}",
    '""',
]
TEXT_TOKENS = [
    '"2024-02-09 21:00:00"',
    '"2024-02-30 21:00:00"',
    '"2023-02-29"',
    '"0000-01-01 00:00:00"',
    '"9999-12-31T23:59:59.999999999-23:59"',
    '"\uff12\uff10\uff12\uff14-02-09 21:00:00"',  # fullwidth digits
    '"2024-02-09\u00a021:00:00"',
    '"\\ud800"',  # a lone surrogate, as JSON can spell it
    '"\\u0000"',
    '"' + "x" * 300 + '"',
    '"' + "x" * 5000 + '"',
    '"A"',
    '"B"',
    '"open"',
    '"closed"',
    '"acct-1"',
    "12",
    "-1",
    "1" * 300,
]
TOKENS = NUMBER_TOKENS + TEXT_TOKENS


def json_values() -> st.SearchStrategy[Any]:
    return st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
        max_leaves=12,
    )


@st.composite
def near_valid(draw: Any, fields: dict[str, list[str]]) -> bytes:
    """An object with the topic's fields, each a valid or a nasty token; sometimes a
    field twice, a field missing, or the whole nested deep."""
    parts = []
    for name, valid in fields.items():
        if draw(st.integers(0, 9)) == 0:
            continue  # missing
        token = draw(st.sampled_from(valid) | st.sampled_from(TOKENS))
        parts.append(f'"{name}":{token}')
        if draw(st.integers(0, 19)) == 0:
            parts.append(f'"{name}":{draw(st.sampled_from(TOKENS))}')  # a duplicate key
    text = "{" + ",".join(parts) + "}"
    depth = draw(st.sampled_from([0, 0, 0, 50, 5000]))  # 5000: past the recursion limit
    return ("[" * depth + text + "]" * depth).encode()


def records(fields: dict[str, list[str]]) -> st.SearchStrategy[bytes | None]:
    return (
        st.none()
        | st.binary(max_size=200)
        | json_values().map(lambda value: json.dumps(value).encode())
        | near_valid(fields)
    )


EVENT = {
    "type": ['"A"', '"B"'],
    "timestamp": ['"2024-02-09 21:00:00"', '"2024-02-09T21:00:30Z"'],
    "value": ["1", "12.34", "1e30", "9" * MAX_DIGITS],
    "id": ['"e-1"', "7"],
}
DEPOSIT = {
    "account": ['"acct-1"', '"acct-2"', '"acct-3"'],
    "deposit_id": ['"d-1"', '"d-2"', '"d-3"', "4"],
    "amount": ['"12.34"', "1e30", '"' + "9" * 30 + '"', "0.01", '"1e2"'],
    "time": ['"2024-02-09T21:00:00Z"'],
}
# A change record's row fields, at the top level: what the size checks come before.
CHANGE = {"op": ['"c"', '"u"'], "after": ['{"id":"e-1","type":"A"}', "null"]}
ACCOUNT = {"account": ['"acct-1"', '"acct-2"'], "status": ['"open"', '"closed"']}
ORDER = {"id": ['"o-1"', "1"], "amount": ["12.34", "1e30"], "item": ['"book"']}
ROW = {"tariff": ['"peak"'], "rate": ["12.34", "1e30", "9" * MAX_DIGITS]}


def rejected(reason: str) -> bool:
    return bool(reason) and len(reason) < 400  # a reason, not a copy of the record


# --- events -------------------------------------------------------------------------


@FUZZ
@given(records(EVENT))
@example(b'{"type":"%s","timestamp":"2024-02-09 21:00:00","value":1}' % (b"x" * 5000))
def test_every_event_is_parsed_or_rejected_with_a_reason(raw: bytes | None) -> None:
    result = parse_event(raw, MAX_BYTES)
    if isinstance(result, Rejection):
        assert rejected(result.reason)
        return
    keyed = encode_keyed_event(result, raw or b"", Source("events", 0, 0), result.time_us)
    assert decode_keyed_event(keyed).event == result
    assert result.id is None or 1 <= len(result.id) <= 256


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(records(EVENT), max_size=12), st.integers(min_value=0))
@example(  # one id on an A and a B: the B is a duplicate, not A's partner
    [
        b'{"type":"A","timestamp":"2024-02-09 21:00:00","value":1,"id":7}',
        b'{"type":"B","timestamp":"2024-02-09 21:00:00","value":1,"id":7}',
    ],
    0,
)
def test_the_rules_agree_with_the_model_on_any_input(stream: list[bytes | None], seed: int) -> None:
    try:
        want = model([stream], drained=True, all_idle=True)
    except AmbiguousStream:
        return
    simulation = Simulation(
        [stream], 1, CONFIG, random.Random(seed), end_idle=True, reading=READING
    )
    simulation.run()
    assert outputs(simulation.drain()) == outputs(want)


# --- the deposit chain --------------------------------------------------------------


def chain(
    accounts: list[tuple[bytes | None, bytes | None]], deposits: list[bytes | None]
) -> tuple[dict[str, Account], dict[str, Totals], int]:
    """What the chain's agents do, record by record, with dicts for tables: route
    (parse), validate (against the account), the ledger (from the validated record)."""
    table: dict[str, bytes] = {}
    ledger: dict[str, bytes] = {}
    seen: set[tuple[str, str]] = set()
    dead = 0
    for key, value in accounts:
        change = rules.parse_account_change(key, value)
        if isinstance(change, str):
            assert change.startswith("invalid: ")
            continue
        stored = table.get(change.account)
        after = rules.apply_change(None if stored is None else rules.decode_account(stored), change)
        if after is None:
            table.pop(change.account, None)
        else:
            table[change.account] = rules.encode_account(after)
    for raw in deposits:
        deposit = rules.parse_deposit(raw)
        if isinstance(deposit, str):
            assert deposit.startswith("invalid: ") and rejected(deposit)
            dead += 1
            continue
        stored = table.get(deposit.account)
        account = None if stored is None else rules.decode_account(stored)
        id_key = (deposit.account, deposit.deposit_id)
        outcome = rules.validate(deposit, account, id_key in seen)
        if isinstance(outcome, str):
            dead += 1
            continue
        seen.add(id_key)
        table[deposit.account] = rules.encode_account(outcome)
        name, amount, balance = rules.parse_validated(rules.record(deposit, outcome.balance))
        before = ledger.get(name)
        after_totals = rules.add(
            None if before is None else rules.decode_totals(before), amount, balance
        )
        ledger[name] = rules.encode_totals(after_totals)
    accounts_now = {name: rules.decode_account(raw) for name, raw in table.items()}
    return accounts_now, {name: rules.decode_totals(raw) for name, raw in ledger.items()}, dead


OPENED = [
    (b"acct-1", b'{"account": "acct-1", "status": "open"}'),
    (b"acct-2", b'{"account": "acct-2", "status": "open"}'),
    (b"acct-3", b'{"account": "acct-3", "status": "closed"}'),
]


@FUZZ
@given(st.lists(records(DEPOSIT), max_size=12))
def test_the_chain_agrees_with_its_model_on_any_deposits(deposits: list[bytes | None]) -> None:
    accounts, totals, dead = chain(OPENED, deposits)
    model_of = expected([(k, v) for k, v in OPENED], [(None, raw) for raw in deposits])
    assert dead == model_of.dead_lettered
    for name, balance in model_of.balances.items():
        assert accounts[name].balance == balance == totals[name].total == totals[name].balance
        assert totals[name].count == accounts[name].deposits == model_of.counts[name]


@FUZZ
@given(st.lists(st.tuples(st.none() | st.binary(max_size=20), records(ACCOUNT)), max_size=10))
def test_every_account_change_is_applied_or_rejected(
    changes: list[tuple[bytes | None, bytes | None]],
) -> None:
    accounts, _, _ = chain(changes, [])
    assert all(account.status in ("open", "closed") for account in accounts.values())


# --- enrichment and delivery --------------------------------------------------------


DAYS = st.none() | st.binary(max_size=12) | st.sampled_from([b"2024-02-09", b"2024-02-30"])


@FUZZ
@given(DAYS, records(ROW))
def test_a_reference_row_is_stored_only_if_every_pair_can_carry_it(
    key: bytes | None, value: bytes | None
) -> None:
    reason = row_rejection(key, value)
    if reason is not None:
        assert reason.startswith("invalid: ") and rejected(reason)
        return
    assert key is not None
    enricher = Enricher(bound_us=0, max_wait_s=0)
    enricher.row(key.decode(), value)
    pair_key = f"{key.decode()}T10:00:00Z"
    out, _ = enricher.pair(pair_key, b'{"timestamp": "%s", "sum": 1}' % pair_key.encode(), 0, 0)
    document = json.loads(enriched_record(out[0]), parse_float=Decimal)
    if value is not None:
        assert document["reference"] == json.loads(value, parse_float=Decimal)


@FUZZ
@given(records(ORDER))
def test_every_order_is_taken_or_rejected_with_a_reason(raw: bytes | None) -> None:
    parsed = parse_order(raw)
    if isinstance(parsed, str):
        assert parsed.startswith("invalid: ") and rejected(parsed)
        return
    assert raw is not None
    identity(raw, parsed, "id").encode()  # the key it is routed by


# --- sizes: at and past the limits, on every input -----------------------------------

SIZES = Sizes()
NOW_MS = 1_707_512_400_000  # 2024-02-09 21:00 UTC: the fuzzed events' time
LIMIT_EDGES = [0, 1, SIZES.key_bytes, SIZES.key_bytes + 1, SIZES.value_bytes - 1]
SIZE_EDGES = [*LIMIT_EDGES, SIZES.value_bytes, SIZES.value_bytes + 1, 900_000, 2_000_000]


def sizes_up_to_past_the_limits() -> st.SearchStrategy[int]:
    return st.sampled_from(SIZE_EDGES) | st.integers(0, 2_100_000)


@st.composite
def sized_records(draw: Any, fields: dict[str, list[str]]) -> tuple[bytes | None, bytes]:
    """A key and a near-valid value, each drawn at or past the limits: the value padded
    with a field (or a run of quotes, which a dead letter must escape) to its size."""
    key_size = draw(st.none() | sizes_up_to_past_the_limits())
    key = None if key_size is None else b"k" * key_size
    record = draw(near_valid(fields))
    size = draw(sizes_up_to_past_the_limits())
    if draw(st.booleans()) and record.startswith(b"{") and len(record) + 10 < size:
        padding = size - len(record) - 10
        value = (
            record[:-1] + (b"," if len(record) > 2 else b"") + b'"pad":"' + b"x" * padding + b'"}'
        )
    else:
        value = b'"' * size
    return key, value


def read_order(key: bytes | None, value: bytes | None) -> object:
    return parse_order(value)


INPUTS = {
    "events": (EVENT, lambda k, v: read_event(k, v, NOW_MS, SIZES, 60_000_000)),
    "changes": (CHANGE, lambda k, v: read_event(k, v, NOW_MS, SIZES, 60_000_000, parse_change)),
    "deposits": (DEPOSIT, lambda k, v: rules.parse_deposit(v)),
    "accounts": (ACCOUNT, rules.parse_account_change),
    "sources": (ROW, row_rejection),
    "orders": (ORDER, read_order),
}


@pytest.mark.parametrize("name", sorted(INPUTS))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_input_refuses_what_is_past_its_limits_and_dead_letters_it_whole_or_cut(
    name: str, data: Any
) -> None:
    """What each agent does first (agents/*.py): the sizes, then the input's own reader.
    A record past a limit is refused naming it; one within is read as usual; the dead
    letter of either always fits in a record a worker can write."""
    fields, read = INPUTS[name]
    key, value = data.draw(sized_records(fields))
    too_large = oversize(key, value, SIZES)
    past = (key is not None and len(key) > SIZES.key_bytes) or len(value) > SIZES.value_bytes
    assert (too_large is not None) == past
    if too_large is not None:
        assert too_large.reason.startswith(("oversize key: ", "oversize record: "))
        reason = too_large.reason
    else:
        result = read(key, value)
        reason = result.reason if isinstance(result, Rejection) else str(result or "")
    dead_key, dead_value = dead_letter(reason[:500], key, value, Source(name, 0, 0), SIZES)
    assert len(dead_value) + len(dead_key or b"") <= SIZES.record_bytes


# --- exactness ----------------------------------------------------------------------

HUGE = "9" * 400


def event(value: str) -> bytes:
    return b'{"type":"A","timestamp":"2024-02-09 21:00:00","value":%s}' % value.encode()


def test_events_past_the_bound_are_rejected_naming_it() -> None:
    for value in (HUGE, "0." + HUGE, "1e999999999", "1e-999999999"):
        result = parse_event(event(value), MAX_BYTES)
        assert isinstance(result, Rejection) and result.reason == OUT_OF_RANGE
        assert f"{MAX_DIGITS} digits" in result.reason and f"1e±{MAX_EXPONENT}" in result.reason


def test_pairs_sum_exactly() -> None:
    a = b'{"type":"A","timestamp":"2024-02-09 21:00:00","value":1e30}'
    b = b'{"type":"B","timestamp":"2024-02-09 21:00:00","value":12.34}'
    want = model([[a, b]], drained=True, all_idle=True)
    ((_, _, _, total),) = want.pairs
    assert Decimal(total) == Decimal("1000000000000000000000000000012.34")
    big = "9" * MAX_DIGITS
    sums = model([[event(big), event(big).replace(b'"A"', b'"B"')]], True, True).pairs
    assert [Decimal(s[3]) for s in sums] == [2 * int(big)]
    simulation = Simulation([[a, b]], 1, CONFIG, random.Random(0), end_idle=True, reading=READING)
    simulation.run()
    assert outputs(simulation.drain()) == outputs(want)


def test_deposits_and_balances_are_exact() -> None:
    thirty = "123456789012345678901234567890.12"
    deposits: list[bytes | None] = [
        b'{"account": "acct-1", "deposit_id": "1", "amount": "%s"}' % thirty.encode(),
        b'{"account": "acct-2", "deposit_id": "1", "amount": 1e30}',
        b'{"account": "acct-2", "deposit_id": "2", "amount": "12.34"}',
        b'{"account": "acct-2", "deposit_id": "3", "amount": "%s"}' % HUGE.encode(),
        b'{"account": "acct-2", "deposit_id": "4", "amount": 1e999999999}',
    ]
    accounts, totals, dead = chain(OPENED, deposits)
    assert accounts["acct-1"].balance == totals["acct-1"].total == Decimal(thirty)
    assert str(accounts["acct-1"].balance) == thirty
    both = Decimal("1000000000000000000000000000012.34")
    assert accounts["acct-2"].balance == totals["acct-2"].total == both
    assert dead == 2
    # A string past the bound is refused by the amount's reader, a JSON number by the decoder.
    assert [rules.parse_deposit(raw) for raw in deposits[3:]] == [
        f"invalid: field 'amount': {OUT_OF_RANGE}",
        f"invalid: {OUT_OF_RANGE}",
    ]


def test_reference_rows_pass_exactly_or_are_rejected_naming_the_bound() -> None:
    exact = b'{"rate": %s, "big": 1e30}' % ("1." + "1" * (MAX_DIGITS - 1)).encode()
    assert row_rejection(b"2024-02-09", exact) is None
    enricher = Enricher(bound_us=0, max_wait_s=0)
    enricher.row("2024-02-09", exact)
    out, _ = enricher.pair("2024-02-09T10:00:00Z", b'{"sum": 0.1}', 0, 0)
    document = json.loads(enriched_record(out[0]), parse_float=Decimal)
    assert document["reference"] == json.loads(exact, parse_float=Decimal)
    assert str(document["reference"]["rate"]) == "1." + "1" * (MAX_DIGITS - 1)
    assert row_rejection(b"2024-02-09", b'{"rate": %s}' % HUGE.encode()) == (
        f"invalid: row: {OUT_OF_RANGE}"
    )


def test_the_ledger_is_lifetime_per_account_id() -> None:
    """docs/chain.md: deleting an account and opening it again restarts its balance; the
    ledger's total and count, and the deposit ids taken, are the account id's lifetime."""
    one = b'{"account": "acct-1", "deposit_id": "1", "amount": "5.00"}'
    two = b'{"account": "acct-1", "deposit_id": "2", "amount": "7.00"}'
    table: dict[str, Account] = {}
    opened = rules.parse_account_change(b"acct-1", b'{"account": "acct-1", "status": "open"}')
    deleted = rules.parse_account_change(b"acct-1", None)
    assert not isinstance(opened, str) and not isinstance(deleted, str)
    first = rules.apply_change(None, opened)
    assert first is not None
    deposit = rules.parse_deposit(one)
    assert isinstance(deposit, Deposit)
    after = rules.validate(deposit, first, False)
    assert isinstance(after, Account)
    totals = rules.add(None, deposit.amount, after.balance)
    assert rules.apply_change(after, deleted) is None
    reopened = rules.apply_change(None, opened)
    assert reopened == Account("open")
    assert rules.validate(deposit, reopened, True) == "rejected: duplicate deposit_id"
    second = rules.parse_deposit(two)
    assert isinstance(second, Deposit)
    again = rules.validate(second, reopened, False)
    assert isinstance(again, Account)
    table["acct-1"] = again
    totals = rules.add(totals, second.amount, again.balance)
    assert table["acct-1"].balance == Decimal("7.00") == totals.balance
    assert totals.total == Decimal("12.00") and totals.count == 2
