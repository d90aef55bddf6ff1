"""The deposit chain's pure rules (pairing/deposits.py) and the generator's model."""

from __future__ import annotations

from decimal import Decimal

from pairing.deposits import (
    Account,
    AccountChange,
    Deposit,
    Totals,
    add,
    apply_change,
    decode_account,
    decode_totals,
    encode_account,
    encode_totals,
    parse_account_change,
    parse_deposit,
    parse_validated,
    record,
    validate,
)
from tools.deposits import INVALID_DEPOSITS, ChainShape, account_records, deposit_records, expected


def test_amounts_are_exact_decimals() -> None:
    for raw in (
        b'{"account": "a", "deposit_id": "1", "amount": 0.1}',
        b'{"account": "a", "deposit_id": "1", "amount": "0.10"}',
    ):
        deposit = parse_deposit(raw)
        assert isinstance(deposit, Deposit) and deposit.amount == Decimal("0.1")
    total = sum((Decimal("0.1"), Decimal("0.2")), Decimal(0))
    assert total == Decimal("0.3")


def test_every_invalid_deposit_says_why() -> None:
    reasons = [parse_deposit(raw) for raw in INVALID_DEPOSITS]
    assert all(isinstance(r, str) and r.startswith("invalid: ") for r in reasons), reasons
    assert len(set(reasons)) >= 8  # distinct reasons, not one catch-all


def test_account_changes_and_tombstones() -> None:
    assert parse_account_change(b"a", b'{"account": "a", "status": "open"}') == AccountChange(
        "a", "open"
    )
    assert parse_account_change(b"a", None) == AccountChange("a", None)
    assert str(parse_account_change(None, None)).startswith("invalid")
    assert str(parse_account_change(b"a", b'{"account": "a", "status": "frozen"}')).startswith(
        "invalid"
    )
    opened = apply_change(None, AccountChange("a", "open"))
    assert opened == Account("open")
    funded = Account("open", Decimal("5.00"), 1)
    closed = apply_change(funded, AccountChange("a", "closed"))
    assert closed == Account("closed", Decimal("5.00"), 1)  # the balance stays
    assert apply_change(funded, AccountChange("a", None)) is None


def test_validation_rejects_unknown_closed_and_duplicate() -> None:
    deposit = Deposit("a", Decimal("2.50"), "d1", "")
    assert validate(deposit, None, False) == "rejected: unknown account"
    assert validate(deposit, Account("closed"), False) == "rejected: account closed"
    assert validate(deposit, Account("open"), True) == "rejected: duplicate deposit_id"
    after = validate(deposit, Account("open", Decimal("1.25"), 3), False)
    assert after == Account("open", Decimal("3.75"), 4)


def test_records_and_state_survive_their_encoding() -> None:
    deposit = Deposit("a", Decimal("2.50"), "d1", "2024-01-01T00:00:00Z")
    assert parse_validated(record(deposit, Decimal("10.05"))) == (
        "a",
        Decimal("2.50"),
        Decimal("10.05"),
    )
    account = Account("open", Decimal("10.05"), 2)
    assert decode_account(encode_account(account)) == account
    totals = add(add(None, Decimal("1.10"), Decimal("1.10")), Decimal("2.20"), Decimal("3.30"))
    assert totals == Totals(Decimal("3.30"), 2, Decimal("3.30"))
    assert decode_totals(encode_totals(totals)) == totals


def test_the_generated_stream_has_every_kind_of_deposit() -> None:
    shape = ChainShape(accounts=50, deposits=3000, seed=4)
    accounts, deposits = account_records(shape), deposit_records(shape)
    model = expected(accounts, deposits)
    reasons = {r for _, v in deposits if isinstance(r := parse_deposit(v), str)}
    assert len(reasons) >= 5
    assert 0 < model.validated < len(deposits)
    assert model.dead_lettered == len(deposits) - model.validated
    assert sum(model.counts.values()) == model.validated
    assert len({v for _, v in deposits}) < len(deposits)  # some sent twice
    closed = sum(b'"closed"' in (v or b"") for _, v in accounts)
    assert closed > 0
    assert all(b.as_tuple().exponent >= -2 for b in model.balances.values())
