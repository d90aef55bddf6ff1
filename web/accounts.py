"""/accounts/{account}: an account's ledger from the deposit chain, answered by the
worker that owns it (docs/chain.md)."""

from __future__ import annotations

from faust.web import Request, Response, View

from agents.chain import ledger, ledger_totals
from app.faust_app import app
from app.settings import settings
from pairing.routing import partition_for
from web.pages import from_owner

conf = settings()


@app.page("/accounts/{account}")
async def account_page(self: View, request: Request, account: str) -> Response:
    """An account's ledger, from whichever worker owns it."""
    partition = partition_for(account, conf.partitions)

    def answer() -> Response:
        totals = ledger_totals(account)
        if totals is None:
            return self.error(404, "no validated deposit for this account", account=account)
        return self.json({"account": account, **totals, "partition": partition})

    changelog = ledger.changelog_topic.get_topic_name()
    return await from_owner(self, request, changelog, partition, f"accounts/{account}", answer)
