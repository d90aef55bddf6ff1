"""A stand-in for a third-party order API that is not idempotent, on real sockets:
`python -m tools.order_api --port 8080 [--honour-keys] [--lookup] [--fail-share 0.2]
[--delay 0.2] [--crash-share 0.01] [--slow-share 0.01 --slow-seconds 15]`.

POST /orders applies the order it is sent (the body) and answers 201, unless told:
  * `honour_keys`: a call whose Idempotency-Key was applied before is answered 200
    and not applied again;
  * `fail_share`: that share of calls is answered 503 (with Retry-After: 0), not applied;
  * `delay`: seconds before each answer;
  * `crash_share`: that share of calls is applied and then the connection is dropped
    with no answer, as a server that crashes after committing;
  * `slow_share`: that share of calls is applied only `slow_seconds` after it arrived,
    and answered then, even if the client has given up meanwhile (the API's processing
    deadline); until then the status lookup answers 404, as many real APIs do;
  * `stuck`: orders whose body contains this text are always answered 503;
  * an order whose JSON has `"reject": true` is answered 422, not applied.
GET /orders/status/{key} (only with `lookup`): 200 if an order with that key was
applied, 404 if not. GET /calls: what it received (counts per order and per key).
POST /control: change any of the settings above (JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from aiohttp import web

from tools.generate import Record

KEY_HEADER = "Idempotency-Key"


@dataclass
class Behaviour:
    honour_keys: bool = False
    lookup: bool = False
    fail_share: float = 0.0
    delay: float = 0.0
    crash_share: float = 0.0
    stuck: str = ""  # orders whose body contains this are always answered 503
    slow_share: float = 0.0
    slow_seconds: float = 0.0


class OrderApi:
    def __init__(self, behaviour: Behaviour | None = None, seed: int | None = None) -> None:
        self.behaviour = behaviour or Behaviour()
        self._random = random.Random(seed)
        self.applied: Counter[str] = Counter()  # times each order (its body) was applied
        self.applied_keys: Counter[str] = Counter()  # the same, by idempotency key
        self.calls: Counter[str] = Counter()  # by what happened: applied, replayed, ...
        self.authorizations: Counter[str] = Counter()  # Authorization headers received
        self._concurrent = 0
        self.max_concurrent = 0  # most calls it was answering at once
        self._processing: set[asyncio.Task[None]] = set()  # slow calls, past any client
        self._runner: web.AppRunner | None = None
        self.port = 0

    def application(self) -> web.Application:
        application = web.Application()
        application.add_routes(
            [
                web.post("/orders", self.post_order),
                web.get("/orders/status/{key}", self.status),
                web.get("/calls", self.report),
                web.post("/control", self.control),
            ]
        )
        return application

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> OrderApi:
        self._runner = web.AppRunner(self.application(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        for processing in self._processing:
            processing.cancel()
        if self._runner is not None:
            await self._runner.cleanup()

    async def processed(self) -> None:
        """Until every slow call received so far has been applied."""
        await asyncio.gather(*self._processing)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def post_order(self, request: web.Request) -> web.StreamResponse:
        self._concurrent += 1
        self.max_concurrent = max(self.max_concurrent, self._concurrent)
        try:
            return await self._post_order(request)
        finally:
            self._concurrent -= 1

    async def _post_order(self, request: web.Request) -> web.StreamResponse:
        behaviour = self.behaviour
        body = await request.read()
        key = request.headers.get(KEY_HEADER, "")
        self.authorizations[request.headers.get("Authorization", "")] += 1
        if behaviour.delay:
            await asyncio.sleep(behaviour.delay)
        stuck = behaviour.stuck and behaviour.stuck.encode() in body
        if stuck or (behaviour.fail_share and self._random.random() < behaviour.fail_share):
            self.calls["failed"] += 1
            return web.json_response(
                {"error": "unavailable"}, status=503, headers={"Retry-After": "0"}
            )
        try:
            order = json.loads(body)
        except ValueError:
            self.calls["bad_request"] += 1
            return web.json_response({"error": "not JSON"}, status=400)
        if isinstance(order, dict) and order.get("reject") is True:
            self.calls["rejected"] += 1
            return web.json_response({"error": "order rejected"}, status=422)
        if behaviour.honour_keys and key and self.applied_keys[key]:
            self.calls["replayed"] += 1
            return web.json_response({"key": key, "replayed": True}, status=200)
        if behaviour.slow_share and self._random.random() < behaviour.slow_share:
            self.calls["slow"] += 1
            processing = asyncio.create_task(self._apply_late(body, key, behaviour.slow_seconds))
            self._processing.add(processing)
            processing.add_done_callback(self._processing.discard)
            await asyncio.shield(processing)  # a client that gave up does not stop it
        else:
            self._apply(body, key)
        if behaviour.crash_share and self._random.random() < behaviour.crash_share:
            self.calls["crashed"] += 1
            assert request.transport is not None
            request.transport.abort()  # applied, and no answer ever comes
            raise asyncio.CancelledError
        return web.json_response({"key": key}, status=201)

    def _apply(self, body: bytes, key: str) -> None:
        self.applied[body.decode()] += 1
        if key:
            self.applied_keys[key] += 1
        self.calls["applied"] += 1

    async def _apply_late(self, body: bytes, key: str, seconds: float) -> None:
        await asyncio.sleep(seconds)  # the API's own processing time
        self._apply(body, key)

    async def status(self, request: web.Request) -> web.Response:
        if not self.behaviour.lookup:
            return web.json_response({"error": "no such endpoint"}, status=405)
        self.calls["lookups"] += 1
        key = request.match_info["key"]
        found = self.applied_keys[key] > 0
        return web.json_response({"key": key, "found": found}, status=200 if found else 404)

    async def report(self, request: web.Request) -> web.Response:
        return web.json_response(self.summary())

    async def control(self, request: web.Request) -> web.Response:
        changes: dict[str, Any] = await request.json()
        for name, value in changes.items():
            if not hasattr(self.behaviour, name):
                return web.json_response({"error": f"unknown setting {name}"}, status=400)
            setattr(self.behaviour, name, value)
        return web.json_response(asdict(self.behaviour))

    def summary(self) -> dict[str, Any]:
        return {
            "behaviour": asdict(self.behaviour),
            "calls": dict(self.calls),
            "orders": len(self.applied),
            "duplicates": sum(n - 1 for n in self.applied.values()),
        }


def generate_orders(
    count: int, seed: int, duplicates: float = 0.02, without_id: float = 0.05, rejected: float = 0.0
) -> list[Record]:
    """Orders as an upstream produces them: keyed by customer, by nothing, or at random;
    some without an id (identified by their bytes), some sent twice (the copy under
    another key), some that the API rejects."""
    rng = random.Random(seed)
    records: list[Record] = []
    for n in range(count):
        order: dict[str, Any] = {
            "customer": f"c{rng.randrange(500)}",
            "amount": rng.randrange(1, 10_000) / 100,
        }
        if rng.random() >= without_id:
            order["id"] = f"order-{seed}-{n}"
        else:
            order["note"] = f"no id {seed}-{n}"
        if rng.random() < rejected:
            order["reject"] = True
        body = json.dumps(order).encode()
        records.append((_key(rng, order), body))
        if rng.random() < duplicates:
            records.append((_key(rng, order), body))
    return records


def _key(rng: random.Random, order: dict[str, Any]) -> bytes | None:
    pick = rng.random()
    if pick < 0.6:
        return str(order["customer"]).encode()
    if pick < 0.8:
        return None
    return rng.randbytes(8)


async def serve(args: argparse.Namespace) -> None:
    behaviour = Behaviour(
        args.honour_keys,
        args.lookup,
        args.fail_share,
        args.delay,
        args.crash_share,
        slow_share=args.slow_share,
        slow_seconds=args.slow_seconds,
    )
    api = await OrderApi(behaviour).start(args.host, args.port)
    print(f"order API on {api.url}: {asdict(behaviour)}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await api.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--honour-keys", action="store_true")
    parser.add_argument("--lookup", action="store_true")
    parser.add_argument("--fail-share", type=float, default=0.0)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--crash-share", type=float, default=0.0)
    parser.add_argument("--slow-share", type=float, default=0.0)
    parser.add_argument("--slow-seconds", type=float, default=0.0)
    asyncio.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
