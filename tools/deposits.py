"""Accounts and deposits for the deposit chain, and what a correct chain
makes of them:

    python -m tools.deposits --accounts 1000 --deposits 20000 --rate 2000 --seed 1 \
        [--closed 0.05] [--unknown 0.02] [--invalid 0.02] [--duplicates 0.03]

Accounts are opened (some then closed) on the accounts topic; deposits go to known,
closed and unknown accounts, some invalid, some sent twice (under another key).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal

from app.settings import Settings
from pairing.deposits import parse_deposit
from pairing.grammar import EXACT
from tools.generate import Record, produce

INVALID_DEPOSITS: list[bytes | None] = [
    b"not json",
    b"",
    b"[1, 2]",
    b'{"deposit_id": "x", "amount": "1.00"}',
    b'{"account": "acct-0", "amount": "1.00"}',
    b'{"account": "acct-0", "deposit_id": "neg", "amount": "-5.00"}',
    b'{"account": "acct-0", "deposit_id": "zero", "amount": 0}',
    b'{"account": "acct-0", "deposit_id": "places", "amount": "1.001"}',
    b'{"account": "acct-0", "deposit_id": "text", "amount": "ten"}',
    b'{"account": "acct-0", "deposit_id": "bool", "amount": true}',
    # Past the bound (docs/grammar.md): the first crashed validation with decimal.Overflow.
    b'{"account": "acct-0", "deposit_id": "huge", "amount": 1e999999999}',
    b'{"account": "acct-0", "deposit_id": "wide", "amount": "%s"}' % (b"9" * 400),
    b'{"account": "acct-0", "deposit_id": "spaced", "amount": " 1.00"}',
]


@dataclass
class ChainShape:
    accounts: int = 100
    deposits: int = 2000
    seed: int = 1
    closed: float = 0.05  # share of accounts closed before any deposit
    unknown: float = 0.02  # share of deposits to accounts that do not exist
    invalid: float = 0.02
    duplicates: float = 0.03


@dataclass
class Expected:
    """What the chain must make of a stream: balances of valid distinct deposits."""

    balances: dict[str, Decimal] = field(default_factory=dict)
    counts: Counter[str] = field(default_factory=Counter)
    validated: int = 0
    dead_lettered: int = 0


def account_records(shape: ChainShape) -> list[Record]:
    rng = random.Random(shape.seed)
    records: list[Record] = []
    for n in range(shape.accounts):
        account = f"acct-{n}"
        records.append(
            (account.encode(), json.dumps({"account": account, "status": "open"}).encode())
        )
        if rng.random() < shape.closed:
            closed = {"account": account, "status": "closed"}
            records.append((account.encode(), json.dumps(closed).encode()))
    return records


def deposit_records(shape: ChainShape) -> list[Record]:
    rng = random.Random(shape.seed + 1)
    records: list[Record] = []
    for n in range(shape.deposits):
        if rng.random() < shape.invalid:
            records.append((b"bad", rng.choice(INVALID_DEPOSITS)))
            continue
        known = rng.random() >= shape.unknown
        account = f"acct-{rng.randrange(shape.accounts)}" if known else f"ghost-{n}"
        cents = rng.randrange(1, 100_000)
        # Amounts as strings and as JSON numbers, both exact.
        amount: str | float = f"{cents // 100}.{cents % 100:02d}"
        deposit = {"account": account, "amount": amount, "deposit_id": f"dep-{shape.seed}-{n}"}
        body = json.dumps(deposit).encode()
        if rng.random() < 0.5:
            body = body.replace(f'"{amount}"'.encode(), str(amount).encode())
        records.append((account.encode() if rng.random() < 0.7 else None, body))
        if rng.random() < shape.duplicates:
            records.append((rng.randbytes(4), body))
    return records


def expected(accounts: list[Record], deposits: list[Record]) -> Expected:
    status: dict[str, str] = {}
    for _, value in accounts:
        assert value is not None
        change = json.loads(value)
        status[change["account"]] = change["status"]
    model = Expected()
    seen: set[tuple[str, str]] = set()
    for _, value in deposits:
        deposit = parse_deposit(value)
        if isinstance(deposit, str):
            model.dead_lettered += 1
            continue
        key = (deposit.account, deposit.deposit_id)
        if status.get(deposit.account) != "open" or key in seen:
            model.dead_lettered += 1
            continue
        seen.add(key)
        before = model.balances.get(deposit.account, Decimal(0))
        model.balances[deposit.account] = EXACT.add(before, deposit.amount)
        model.counts[deposit.account] += 1
        model.validated += 1
    return model


async def produce_chain(conf: Settings, shape: ChainShape, rate: float) -> None:
    await produce(account_records(shape), conf.kafka, conf.accounts_topic, 0, False)
    await produce(deposit_records(shape), conf.kafka, conf.deposits_topic, rate, True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--accounts", type=int, default=100)
    parser.add_argument("--deposits", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=0, help="deposits per second (0: at once)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--closed", type=float, default=0.05, help="share of accounts closed")
    parser.add_argument("--unknown", type=float, default=0.02, help="share to unknown accounts")
    parser.add_argument("--invalid", type=float, default=0.02, help="share of invalid deposits")
    parser.add_argument("--duplicates", type=float, default=0.03, help="share sent twice")
    args = parser.parse_args()
    shape = ChainShape(
        args.accounts,
        args.deposits,
        args.seed,
        args.closed,
        args.unknown,
        args.invalid,
        args.duplicates,
    )
    asyncio.run(produce_chain(Settings(), shape, args.rate))


if __name__ == "__main__":
    main()
