"""The deposit chain: a validation service and a downstream ledger, each
consuming, updating its state in a changelog-backed table (a compacted topic) and
producing in one transaction. Imported only when PAIRSTREAM_CHAIN_ENABLED is set.

    deposits ──route──▶ <app>-deposits-by-account ─┐
    accounts ──route──▶ <app>-accounts-by-account ─┴─validate──▶ deposits.validated ──ledger
       (compacted)         (key: account)          │  (balance after)            (totals)
                                                    └──▶ deposits.dlq (invalid, rejected)

Both inputs are re-keyed by account, so an account's changes and its deposits meet,
in arrival order, on one partition of the validation state, whatever key they came
with. An account change is applied as it is consumed (a stream-table join by
processing order, as in Kafka Streams): a deposit racing its account's opening or
closing is decided by which the worker consumed first (docs/chain.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from app.exactly_once.in_order import events_once
from app.exactly_once.outbox import Outbox
from app.exactly_once.step import exactly_once
from app.faust_app import app
from app.settings import settings
from app.topics import bytes_topic
from pairing.deposits import (
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
from pairing.grammar import oversize_invalid
from pairing.records import Source
from pairing.routing import partition_for
from tables import TableWriter, bytes_table

conf = settings()
DEPOSITS = conf.deposits_by_account_topic
ACCOUNTS = conf.accounts_by_account_topic
DLQ = conf.deposits_dead_letter_topic

# Validation's state: `a:<account>` -> the account, `d:<account>:<deposit id>` -> seen.
accounts = bytes_table("accounts", conf.partitions, [DEPOSITS, ACCOUNTS])
# The ledger's: `<account>` -> totals.
ledger = bytes_table("ledger", conf.partitions, [conf.validated_topic])


deposits_in = bytes_topic(conf.deposits_topic, internal=False)
accounts_in = bytes_topic(conf.accounts_topic, internal=False)
by_account = bytes_topic(DEPOSITS, ACCOUNTS, internal=True)  # validate consumes both
validated = bytes_topic(conf.validated_topic, internal=False)


def dead_letter(outbox: Outbox, message: Any, reason: str) -> None:
    outbox.count("dead_lettered")
    where = Source(message.topic, message.partition, message.offset)
    outbox.dead_letter(DLQ, reason, message.key, message.value, where)


def route(parse: Callable[[Any], Any], target: str, counter: str) -> Callable[[Any], Any]:
    """An agent body that re-keys each valid record by its account, dead-lettering the
    rest; `parse` gives an object with `.account`, or the reason it is invalid."""

    async def agent(stream: Any) -> None:
        async for event in events_once(app, stream):
            message = event.message
            async with exactly_once(app, event, dead_letters=DLQ) as task:
                parsed = oversize_invalid(message.key, message.value, conf.sizes) or parse(message)
                if isinstance(parsed, str):
                    dead_letter(task.outbox, message, parsed)
                    continue
                task.outbox.count(counter)
                partition = partition_for(parsed.account, conf.partitions)
                task.outbox.send(target, parsed.account.encode(), message.value, partition)

    return agent


route_deposits = app.agent(deposits_in, name="route_deposits")(
    route(lambda m: parse_deposit(m.value), DEPOSITS, "deposits")
)
route_accounts = app.agent(accounts_in, name="route_accounts")(
    route(lambda m: parse_account_change(m.key, m.value), ACCOUNTS, "account_changes")
)


@app.agent(by_account)
async def validate_deposits(stream: Any) -> None:
    async for event in events_once(app, stream):
        message = event.message
        async with exactly_once(app, event, dead_letters=DLQ) as task:
            state = TableWriter(accounts, task)
            if message.topic == ACCOUNTS:
                change = parse_account_change(message.key, message.value)
                assert not isinstance(change, str)  # route passed it
                key = f"a:{change.account}".encode()
                stored = state.get(key)
                after = apply_change(None if stored is None else decode_account(stored), change)
                if after is None:
                    state.delete(key)
                else:
                    state.put(key, encode_account(after))
                task.outbox.count("account_changes")
                continue
            deposit = parse_deposit(message.value)
            assert not isinstance(deposit, str)  # route passed it
            account_key = f"a:{deposit.account}".encode()
            seen_key = f"d:{deposit.account}:{deposit.deposit_id}".encode()
            stored = state.get(account_key)
            account = None if stored is None else decode_account(stored)
            outcome = validate(deposit, account, state.get(seen_key) is not None)
            if isinstance(outcome, str):
                dead_letter(task.outbox, message, outcome)
                continue
            state.put(account_key, encode_account(outcome))
            state.put(seen_key, b"")
            task.outbox.count("validated")
            task.outbox.send(
                conf.validated_topic,
                deposit.account.encode(),
                record(deposit, outcome.balance),
                message.partition,
            )


@app.agent(validated)
async def keep_ledger(stream: Any) -> None:
    async for event in events_once(app, stream):
        message = event.message
        async with exactly_once(app, event, dead_letters=DLQ) as task:
            value: bytes | None = message.value
            assert value is not None  # written by validate_deposits
            account, amount, balance = parse_validated(value)
            totals = TableWriter(ledger, task)
            stored = totals.get(account.encode())
            after = add(None if stored is None else decode_totals(stored), amount, balance)
            totals.put(account.encode(), encode_totals(after))
            task.outbox.count("ledger_entries")


def ledger_totals(account: str) -> dict[str, Any] | None:
    """An account's ledger, as this worker's table holds it (outside a step)."""
    raw = ledger.data.get(account.encode())
    if raw is None:
        return None
    totals = decode_totals(raw)
    return {"total": str(totals.total), "count": totals.count, "balance": str(totals.balance)}
