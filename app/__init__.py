"""`faust -A app worker` loads this package: the app and everything it runs."""

from app.faust_app import app

# Registered with the app on import.
from app import local_state  # noqa: F401  isort: skip
from agents import ingest, pairing  # noqa: F401  isort: skip
from app import web  # noqa: F401  isort: skip

__all__ = ["app"]
