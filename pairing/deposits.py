"""The deposit chain, pure: parsing deposits and account changes,
validating a deposit against its account, and the ledger's totals.

Inputs are read by the one grammar (pairing/grammar.py, docs/grammar.md). Amounts are
exact decimals (a JSON number or a decimal string, at most 2 places); balances and
totals are exact sums (the grammar's `EXACT` context), written as strings so nothing rounds them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

from pairing.grammar import EXACT, Rejection, decode_object, identity, identity_bytes, number

MAX_PLACES = 2
ACCOUNT_STATUSES = ("open", "closed")


@dataclass(frozen=True, slots=True)
class Deposit:
    account: str
    amount: Decimal
    deposit_id: str
    time: str


@dataclass(frozen=True, slots=True)
class AccountChange:
    account: str
    status: str | None  # None: deleted (a tombstone)


@dataclass(frozen=True, slots=True)
class Account:
    """What validation keeps per account."""

    status: str  # "open" | "closed"
    balance: Decimal = Decimal(0)
    deposits: int = 0


@dataclass(frozen=True, slots=True)
class Totals:
    """What the ledger keeps per account."""

    total: Decimal = Decimal(0)
    count: int = 0
    balance: Decimal = Decimal(0)  # as of the last validated deposit


def _id(record: dict[str, Any], field: str) -> str | Rejection:
    if record.get(field) in (None, ""):
        return Rejection(f"missing {field}")
    return identity(record[field], field)


def _amount(value: Any) -> Decimal | Rejection:
    amount = number(value, "amount", text_too=True)
    if isinstance(amount, Rejection):
        return amount
    amount = Decimal(amount)
    exponent = amount.as_tuple().exponent
    if isinstance(exponent, int) and exponent < -MAX_PLACES:
        return Rejection(f"amount has more than {MAX_PLACES} decimal places")
    if amount <= 0:
        return Rejection("amount must be positive")
    return amount


def _deposit(raw: bytes | None) -> Deposit | Rejection:
    record = decode_object(raw)
    if isinstance(record, Rejection):
        return record
    account = _id(record, "account")
    if isinstance(account, Rejection):
        return account
    deposit_id = _id(record, "deposit_id")
    if isinstance(deposit_id, Rejection):
        return deposit_id
    amount = _amount(record.get("amount"))
    if isinstance(amount, Rejection):
        return amount
    time = record.get("time")
    return Deposit(account, amount, deposit_id, time if isinstance(time, str) else "")


def parse_deposit(raw: bytes | None) -> Deposit | str:
    """A deposit, or why it is invalid."""
    parsed = _deposit(raw)
    return f"invalid: {parsed.reason}" if isinstance(parsed, Rejection) else parsed


def _account_change(key: bytes | None, raw: bytes | None) -> AccountChange | Rejection:
    if raw is None:
        if not key:
            return Rejection("a tombstone without a key")
        account = identity_bytes(key, "key")
        return account if isinstance(account, Rejection) else AccountChange(account, None)
    record = decode_object(raw)
    if isinstance(record, Rejection):
        return record
    account, status = _id(record, "account"), record.get("status")
    if isinstance(account, Rejection):
        return account
    if status not in ACCOUNT_STATUSES:
        return Rejection(f"status must be one of {', '.join(ACCOUNT_STATUSES)}")
    return AccountChange(account, status)


def parse_account_change(key: bytes | None, raw: bytes | None) -> AccountChange | str:
    """An account opened or closed, or deleted (a tombstone: the key, no value)."""
    parsed = _account_change(key, raw)
    return f"invalid: {parsed.reason}" if isinstance(parsed, Rejection) else parsed


def apply_change(account: Account | None, change: AccountChange) -> Account | None:
    """The account after a change; its balance survives a close and a reopen, not a
    deletion. The ledger's totals and the deposit ids taken are the account id's, for its
    lifetime (docs/chain.md)."""
    if change.status is None:
        return None
    if account is None:
        return Account(change.status)
    return replace(account, status=change.status)


def validate(deposit: Deposit, account: Account | None, seen: bool) -> Account | str:
    """The account after the deposit, or why the deposit is rejected."""
    if account is None:
        return "rejected: unknown account"
    if account.status != "open":
        return "rejected: account closed"
    if seen:
        return "rejected: duplicate deposit_id"
    balance = EXACT.add(account.balance, deposit.amount)
    return replace(account, balance=balance, deposits=account.deposits + 1)


def record(deposit: Deposit, balance: Decimal) -> bytes:
    """A validated deposit, with the balance after it."""
    return json.dumps(
        {
            "account": deposit.account,
            "deposit_id": deposit.deposit_id,
            "amount": str(deposit.amount),
            "time": deposit.time,
            "balance": str(balance),
        }
    ).encode()


def parse_validated(raw: bytes) -> tuple[str, Decimal, Decimal]:
    """Account, amount and balance of a validated deposit (written by `record`)."""
    validated = json.loads(raw)
    return validated["account"], Decimal(validated["amount"]), Decimal(validated["balance"])


def add(totals: Totals | None, amount: Decimal, balance: Decimal) -> Totals:
    before = totals or Totals()
    return Totals(EXACT.add(before.total, amount), before.count + 1, balance)


def encode_account(account: Account) -> bytes:
    return json.dumps(
        {"status": account.status, "balance": str(account.balance), "deposits": account.deposits}
    ).encode()


def decode_account(raw: bytes) -> Account:
    data = json.loads(raw)
    return Account(data["status"], Decimal(data["balance"]), data["deposits"])


def encode_totals(totals: Totals) -> bytes:
    return json.dumps(
        {"total": str(totals.total), "count": totals.count, "balance": str(totals.balance)}
    ).encode()


def decode_totals(raw: bytes) -> Totals:
    data = json.loads(raw)
    return Totals(Decimal(data["total"]), data["count"], Decimal(data["balance"]))
