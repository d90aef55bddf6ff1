"""The worker, assembled: the app, the stages it runs, and the web endpoint above them.

This is the one place that shows what plugs into what: each agent module declares its
faust agents and its `STAGE` (what it plugs into the exactly-once core); here the
stages are plugged in, in data-flow order, and the web pages and token installed.
"""

import asyncio

import uvloop

from app.settings import settings

conf = settings()
# faust's command imports the app before it makes the event loop: the policy set here
# makes that loop and those of faust's threads, whatever faust's -L chose.
asyncio.set_event_loop_policy(uvloop.EventLoopPolicy() if conf.event_loop == "uvloop" else None)

from agents import ingest, input_growth, pairing  # noqa: E402  (after the loop's choice)
from app.exactly_once.stage import Stage  # noqa: E402
from app.faust_app import app  # noqa: E402
from web import auth, pages  # noqa: E402

stages: list[Stage] = [ingest.STAGE, pairing.STAGE]
if conf.delivery_enabled:
    from delivery import agent as delivery

    stages.append(delivery.STAGE)
if conf.enrichment_enabled:
    from agents import enrichment

    stages.append(enrichment.STAGE)
if conf.patterns_file is not None:
    from agents import patterns

    stages += patterns.STAGES
if conf.chain_enabled:
    from agents import chain  # noqa: F401  (its agents; no stage hooks)
    from web import accounts  # noqa: F401  (/accounts/{account})

for stage in stages:
    app.partition_tasks.plug_in(stage)
auth.install(app, conf.web_token, conf.web_open_metrics)

__all__ = ["app", "input_growth", "pages"]
