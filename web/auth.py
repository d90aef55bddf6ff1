"""The web token (PAIRSTREAM_WEB_TOKEN): one aiohttp middleware on faust's web app
asks every request for `Authorization: Bearer <token>`, faust's own debug pages and
unknown paths included, so a page added later cannot forget it. Only the paths named
here are open.
"""

from __future__ import annotations

import hmac
from typing import Any, cast

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from faust.types import AppT
from pydantic import SecretStr

ALWAYS_OPEN = frozenset({"/health", "/ready", "/live"})  # no data (web/probes.py): supervisors ask
OPEN_WITH_METRICS = frozenset({"/metrics", "/"})  # with PAIRSTREAM_WEB_OPEN_METRICS
# What the dashboard and the 401 tell a client; never the token.
MISSING = "this page needs the header Authorization: Bearer <PAIRSTREAM_WEB_TOKEN>"
WRONG = "the bearer token is wrong"


def refusal(
    path: str, authorization: str | None, token: str | None, open_metrics: bool
) -> str | None:
    """Why a request for `path` with this Authorization header is refused; None when
    it may be served."""
    if token is None or path in ALWAYS_OPEN or (open_metrics and path in OPEN_WITH_METRICS):
        return None
    if authorization is None:
        return MISSING
    scheme, _, given = authorization.partition(" ")
    # Bytes: compare_digest takes str of ASCII only, and a header may hold anything
    # (aiohttp decodes undecodable bytes as surrogates).
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        given.strip().encode(errors="surrogateescape"), token.encode()
    ):
        return WRONG
    return None


def bearer(token: SecretStr | None) -> dict[str, str]:
    """The header a worker sends another with (every worker has the same token)."""
    return {"Authorization": f"Bearer {token.get_secret_value()}"} if token else {}


def token_middleware(token: SecretStr | None, open_metrics: bool) -> Middleware:
    secret = token.get_secret_value() if token else None

    @web.middleware
    async def require_token(request: web.Request, handler: Handler) -> web.StreamResponse:
        refused = refusal(request.path, request.headers.get("Authorization"), secret, open_metrics)
        if refused is not None:
            return web.json_response(
                {"error": refused}, status=401, headers={"WWW-Authenticate": "Bearer"}
            )
        return await handler(request)

    return require_token


def install(app: AppT, token: SecretStr | None, open_metrics: bool) -> None:
    """Put every page of the app's web server behind the token, faust's own included;
    before the server starts (aiohttp freezes its middlewares then)."""
    server: Any = app.web
    cast(web.Application, server.web_app).middlewares.append(token_middleware(token, open_metrics))
