"""The worker: the Faust app and everything that registers with it on import."""

from agents import ingest, pairing
from app import web
from app.faust_app import app
from app.settings import settings

if settings().delivery_enabled:
    from agents import delivery  # noqa: F401  (registers its agents)
if settings().enrichment_enabled:
    from agents import enrichment  # noqa: F401  (registers its agents)
if settings().chain_enabled:
    from agents import chain  # noqa: F401  (registers its agents and /accounts)

__all__ = ["app", "ingest", "pairing", "web"]
