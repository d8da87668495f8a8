"""A reverse proxy in front of an S3 endpoint, in the test process, with
fault hooks: what real stores do under load or failure and moto never does.

    with S3FaultProxy(upstream) as proxy:
        proxy.fail_rate = 0.3                    # 503 SlowDown / 500 InternalError
        proxy.hold = lambda r: r.method == "PUT" # park matching requests...
        proxy.release.set()                      # ...until released
        proxy.drop_after = lambda r: ...         # forward, then drop the answer
        proxy.log                                # (method, path, status) of each

Requests are forwarded byte for byte with their Host header, so SigV4
signatures made for the proxy's address hold at the upstream. `hold` and
`drop_after` take a `Seen` (method, path, query, headers) and return a bool.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Self

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from devstack.processes import free_port

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "expect", "te", "trailer",
              "upgrade", "proxy-connection"}
FAILURES = ((503, "SlowDown", "Please reduce your request rate."),
            (500, "InternalError", "We encountered an internal error. Please try again."))


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    query: str
    headers: CIMultiDict[str]


def error_body(code: str, message: str) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
            f"<Message>{message}</Message><RequestId>proxy</RequestId></Error>").encode()


class S3FaultProxy:
    def __init__(self, upstream: str, *, seed: int = 7) -> None:
        self.upstream = upstream.rstrip("/")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.fail_rate = 0.0
        self.hold: Callable[[Seen], bool] | None = None
        self.release = threading.Event()
        self.held = threading.Event()  # set once a request is parked
        self.drop_after: Callable[[Seen], bool] | None = None
        self.log: list[tuple[str, str, int]] = []  # status 0: dropped
        self.injected = 0
        self._random = random.Random(seed)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._ready = threading.Event()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    # -- lifecycle -------------------------------------------------------------

    def __enter__(self) -> Self:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the S3 fault proxy did not start")
        return self

    def __exit__(self, *exc: object | TracebackType | None) -> None:
        self.release.set()
        asyncio.run_coroutine_threadsafe(self._cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application(client_max_size=1024**3)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()

    async def _cleanup(self) -> None:
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    def statuses(self, method: str | None = None) -> list[int]:
        return [status for m, _, status in list(self.log) if method in (None, m)]

    # -- the proxy ---------------------------------------------------------------

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        seen = Seen(request.method, request.path, request.query_string,
                    CIMultiDict(request.headers))
        body = await request.read()
        if self.fail_rate and self._random.random() < self.fail_rate:
            status, code, message = self._random.choice(FAILURES)
            self.injected += 1
            self.log.append((request.method, request.path, status))
            return web.Response(status=status, body=error_body(code, message),
                                content_type="application/xml")
        if self.hold is not None and self.hold(seen):
            self.held.set()
            while not self.release.is_set():
                await asyncio.sleep(0.05)  # poll of a wait loop
        if self._session is None:
            self._session = aiohttp.ClientSession(auto_decompress=False)
        headers = CIMultiDict((k, v) for k, v in request.headers.items()
                              if k.lower() not in HOP_BY_HOP)
        try:
            async with self._session.request(
                    request.method, self.upstream + request.path_qs, data=body or None,
                    headers=headers, skip_auto_headers=("Content-Type", "User-Agent",
                                                        "Accept", "Accept-Encoding"),
                    allow_redirects=False, timeout=aiohttp.ClientTimeout(total=300)) as answer:
                payload = await answer.read()
                status, answer_headers = answer.status, answer.headers
        except aiohttp.ClientError:
            # The upstream is down: so is this endpoint, as a client sees it.
            self.log.append((request.method, request.path, 0))
            assert request.transport is not None
            request.transport.abort()
            raise web.HTTPServiceUnavailable() from None
        if self.drop_after is not None and self.drop_after(seen):
            # The upstream did the request; its answer never reaches the client.
            self.log.append((request.method, request.path, 0))
            assert request.transport is not None
            request.transport.abort()
            raise web.HTTPServiceUnavailable()
        self.log.append((request.method, request.path, status))
        response = web.StreamResponse(status=status)
        for key, value in answer_headers.items():
            if key.lower() not in HOP_BY_HOP and key.lower() != "content-length":
                response.headers.add(key, value)
        response.content_length = int(answer_headers.get("Content-Length", len(payload)))
        await response.prepare(request)
        if request.method != "HEAD" and payload:
            await response.write(payload)
        await response.write_eof()
        return response
