"""The third-party API, over HTTP (aiohttp): one POST per message, and the status
lookup by idempotency key where the API offers one. Only this module speaks HTTP."""

from __future__ import annotations

import time

import aiohttp

from app.settings import Settings
from delivery.rules import Answer, parse_retry_after

EXCERPT_BYTES = 300


class ApiClient:
    def __init__(self, conf: Settings) -> None:
        self._url = conf.delivery_url
        self._status_url = conf.delivery_status_url
        self._key_header = conf.delivery_idempotency_header
        self._headers = {"Content-Type": "application/json", **conf.delivery_headers}
        if conf.delivery_authorization is not None:
            self._headers["Authorization"] = conf.delivery_authorization.get_secret_value()
        self._timeout = aiohttp.ClientTimeout(total=conf.delivery_timeout_seconds)
        self._limit = conf.delivery_max_in_flight
        self._session: aiohttp.ClientSession | None = None

    @property
    def has_lookup(self) -> bool:
        return self._status_url is not None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            # As many connections as calls in flight, so a call never waits for one
            # after its attempt is on the delivery log.
            connector = aiohttp.TCPConnector(limit=self._limit + 2)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def send(self, key: str, body: bytes) -> tuple[Answer, float]:
        """The API's answer to one call, and how long it took (seconds)."""
        started = time.monotonic()
        headers = {**self._headers, self._key_header: key}
        try:
            async with self._open().post(self._url, data=body, headers=headers) as response:
                text = await response.text(errors="replace")
                answer = Answer(
                    status=response.status,
                    retry_after=parse_retry_after(response.headers.get("Retry-After")),
                    excerpt=text[:EXCERPT_BYTES],
                )
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            answer = Answer(status=None, maybe_sent=False, excerpt=repr(exc)[:EXCERPT_BYTES])
        except (aiohttp.ClientError, TimeoutError) as exc:
            # The request may have reached the API before the connection failed or the
            # time ran out.
            answer = Answer(status=None, maybe_sent=True, excerpt=repr(exc)[:EXCERPT_BYTES])
        return answer, time.monotonic() - started

    async def has(self, key: str) -> bool | None:
        """Whether the API has the message with this key; None if it cannot say now."""
        assert self._status_url is not None
        url = self._status_url.replace("{key}", key)
        try:
            async with self._open().get(url, headers=self._headers) as response:
                await response.read()
                if response.status == 200:
                    return True
                if response.status == 404:
                    return False
                return None
        except (aiohttp.ClientError, TimeoutError):
            return None
