"""The worker: the Faust app and everything that registers with it on import."""

import asyncio

import uvloop

from app.settings import settings

# faust's command imports the app before it makes the event loop: the policy set here
# makes that loop and those of faust's threads, whatever faust's -L chose.
asyncio.set_event_loop_policy(
    uvloop.EventLoopPolicy() if settings().event_loop == "uvloop" else None
)

from agents import ingest, input_growth, pairing  # noqa: E402  (after the loop's choice)
from app import web  # noqa: E402
from app.faust_app import app  # noqa: E402

if settings().delivery_enabled:
    from agents import delivery  # noqa: F401  (registers its agents)
if settings().enrichment_enabled:
    from agents import enrichment  # noqa: F401  (registers its agents)
if settings().chain_enabled:
    from agents import chain  # noqa: F401  (registers its agents and /accounts)

__all__ = ["app", "ingest", "input_growth", "pairing", "web"]
