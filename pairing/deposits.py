"""The deposit chain (seed 001), pure: parsing deposits and account changes,
validating a deposit against its account, and the ledger's totals.

Amounts are exact decimals (a JSON number or a decimal string, at most 2 places);
balances and totals are decimals, written as strings so nothing rounds them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation
from typing import Any

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


def _object(raw: bytes | None) -> dict[str, Any] | str:
    if not raw:
        return "invalid: empty"
    try:
        parsed = json.loads(raw, parse_float=Decimal)
    except (ValueError, UnicodeDecodeError) as exc:
        return f"invalid: not JSON ({exc.__class__.__name__})"
    if not isinstance(parsed, dict):
        return "invalid: not a JSON object"
    return parsed


def _text(record: dict[str, Any], field: str) -> str | None:
    value = record.get(field)
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        return None
    return str(value)


def parse_amount(value: Any) -> Decimal | str:
    if isinstance(value, bool) or not isinstance(value, (int, Decimal, str)):
        return "invalid: amount must be a number or a decimal string"
    try:
        amount = Decimal(value)
    except InvalidOperation:
        return "invalid: amount is not a decimal"
    if not amount.is_finite():
        return "invalid: amount is not finite"
    exponent = amount.as_tuple().exponent
    if isinstance(exponent, int) and exponent < -MAX_PLACES:
        return f"invalid: amount has more than {MAX_PLACES} decimal places"
    if amount <= 0:
        return "invalid: amount must be positive"
    return amount


def parse_deposit(raw: bytes | None) -> Deposit | str:
    """A deposit, or why it is invalid."""
    record = _object(raw)
    if isinstance(record, str):
        return record
    account, deposit_id = _text(record, "account"), _text(record, "deposit_id")
    if account is None:
        return "invalid: missing account"
    if deposit_id is None:
        return "invalid: missing deposit_id"
    amount = parse_amount(record.get("amount"))
    if isinstance(amount, str):
        return amount
    time = record.get("time")
    return Deposit(account, amount, deposit_id, time if isinstance(time, str) else "")


def parse_account_change(key: bytes | None, raw: bytes | None) -> AccountChange | str:
    """An account opened or closed, or deleted (a tombstone: the key, no value)."""
    if raw is None:
        if not key:
            return "invalid: a tombstone without a key"
        return AccountChange(key.decode(errors="replace"), None)
    record = _object(raw)
    if isinstance(record, str):
        return record
    account, status = _text(record, "account"), record.get("status")
    if account is None:
        return "invalid: missing account"
    if status not in ACCOUNT_STATUSES:
        return f"invalid: status must be one of {', '.join(ACCOUNT_STATUSES)}"
    return AccountChange(account, status)


def apply_change(account: Account | None, change: AccountChange) -> Account | None:
    """The account after a change; its balance survives a close and a reopen."""
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
    return replace(account, balance=account.balance + deposit.amount, deposits=account.deposits + 1)


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
    return Totals(before.total + amount, before.count + 1, balance)


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
