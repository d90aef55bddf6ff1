"""The worker: the Faust app and everything that registers with it on import."""

from agents import ingest, pairing
from app import local_state, web
from app.faust_app import app

__all__ = ["app", "ingest", "local_state", "pairing", "web"]
