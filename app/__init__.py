"""`faust -A app worker` imports this package and asks it for `app`; only then are
the app and everything registered with it imported (`app.main`). Importing
`app.settings` or any other module of the package alone stays cheap."""

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "app":
        from app.main import app

        return app
    raise AttributeError(f"module 'app' has no attribute {name!r}")
