"""Which requests the web token lets through, and that faust's web app asks for it."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import TestClient, TestServer
from faust.web import Request, Response, View
from pydantic import SecretStr

from app.faust_app import create_app
from web.auth import MISSING, WRONG, install, refusal

TOKEN = "t0ken-\u00e9-42"  # not ASCII: compare_digest of str would raise
DATA = ["/stats", "/stats/cluster", "/pending/x", "/accounts/7", "/table/t/", "/router/"]
SPECIAL = ["/graph/", "/assignment/", "/performance/", "/no-such-page", "/health/", "//health"]


@pytest.mark.parametrize("path", [*DATA, *SPECIAL, "/metrics", "/"])
def test_without_a_token_everything_is_open(path: str) -> None:
    assert refusal(path, None, None, open_metrics=False) is None


@pytest.mark.parametrize("open_metrics", [False, True])
@pytest.mark.parametrize("path", [*DATA, *SPECIAL])
def test_with_a_token_every_page_but_health_needs_it(path: str, open_metrics: bool) -> None:
    assert refusal(path, None, TOKEN, open_metrics) == MISSING
    assert refusal(path, f"Bearer {TOKEN}", TOKEN, open_metrics) is None
    assert refusal("/health", None, TOKEN, open_metrics) is None


@pytest.mark.parametrize("path", ["/metrics", "/"])
def test_metrics_and_the_dashboard_page_are_open_only_when_asked(path: str) -> None:
    assert refusal(path, None, TOKEN, open_metrics=False) == MISSING
    assert refusal(path, f"Bearer {TOKEN}", TOKEN, open_metrics=False) is None
    assert refusal(path, None, TOKEN, open_metrics=True) is None


@pytest.mark.parametrize(
    "header",
    [
        "",
        "Bearer",
        "Bearer ",
        "Bearer wrong",
        f"Bearer {TOKEN}x",
        f"Bearer {TOKEN[:-1]}",
        f"Basic {TOKEN}",
        TOKEN,
        "Bearer \udcff",  # a header aiohttp decoded with surrogateescape
    ],
)
def test_a_wrong_or_malformed_header_is_refused(header: str) -> None:
    assert refusal("/stats", header, TOKEN, open_metrics=False) == WRONG


@pytest.mark.parametrize("header", [f"bearer {TOKEN}", f"BEARER  {TOKEN} "])
def test_the_scheme_is_any_case_and_spaces_around_the_token_do_not_count(header: str) -> None:
    assert refusal("/stats", header, TOKEN, open_metrics=False) is None


async def test_faust_s_web_app_asks_for_the_token_once_it_is_installed() -> None:
    fresh = create_app()
    install(fresh, SecretStr(TOKEN), open_metrics=False)

    @fresh.page("/stats")
    async def stats(self: View, request: Request) -> Response:
        return self.json({"data": 1})

    async with TestClient(TestServer(fresh.web.web_app)) as client:
        for path, headers in [("/stats", {}), ("/nowhere", {"Authorization": "Bearer no"})]:
            async with client.get(path, headers=headers) as refused:
                assert refused.status == 401
                assert refused.headers["WWW-Authenticate"] == "Bearer"
                assert await refused.json() == {"error": MISSING if not headers else WRONG}
        async with client.get("/stats", headers={"Authorization": f"Bearer {TOKEN}"}) as served:
            assert (served.status, await served.json()) == (200, {"data": 1})
