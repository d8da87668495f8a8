"""A hold/release gate in front of an HTTP server (the simulator, an S3
endpoint), run by the test process in a thread of its own.

Every request passes through to the upstream server unless a rule says
otherwise:

    with Gate(simulator_url) as gate:
        url = gate.url("victim")            # a port of its own: counted as "victim"
        last = gate.hold(containing=texts)  # every request of these prompts, anyone's
        early = gate.hold(callers={"victim"}, after=5)  # the victim's, after its first 5
        ...
        gate.wait(lambda: gate.count("victim").held >= 3, 30, "the victim's requests held")
        early.release()                     # the held ones go on; new ones pass
        early.again()                       # ... until it holds again
        gate.fail(400, "...")               # every chat request now fails (held ones
                                            # too, when released) ...
        gate.pass_through()                 # ... and passes again
        s3 = gate.hold(paths=("/bucket/",), methods={"PUT"})  # in front of S3: uploads

A held request waits in the gate before it reaches the upstream server, until
its rule is released (or its client hangs up): so a run held by a rule
cannot finish before the test releases it, and whatever the test does
before that happens mid-run by construction. Counters by caller (requests
seen, answered, pending, held now, failed by the gate) and the list of
answered requests (`gate.answered`: caller, method, path, status, body) let a
test wait on what the services actually did instead of on a timer.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

CHAT = "/v1/chat/completions"
# Not forwarded: they describe one hop, or aiohttp sets them for the next one.
HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
               "proxy-authorization", "proxy-authenticate", "content-length", "expect"}


@dataclass
class Count:
    """Requests of one caller (or of all): `seen` arrived, `answered` got the
    upstream server's answer, `pending` are in the gate without one yet
    (held, or with the upstream server), `held` wait in the gate now,
    `failed` got the gate's error, `abandoned` were hung up on while held."""

    seen: int = 0
    answered: int = 0
    pending: int = 0
    held: int = 0
    failed: int = 0
    abandoned: int = 0


@dataclass(frozen=True)
class Answered:
    """One request the upstream server answered (`body`: the request's)."""

    caller: str
    method: str
    path: str
    status: int
    body: bytes = b""


@dataclass(eq=False)
class Hold:
    """One hold rule; `release()` lets its held requests go on and every
    later one pass."""

    gate: Gate
    callers: frozenset[str] | None
    paths: tuple[str, ...] | None
    methods: frozenset[str] | None
    containing: tuple[bytes, ...]
    after: int
    matched: int = 0  # requests this rule applied to (held or let pass as one of `after`)
    held: int = 0  # waiting now
    released: bool = False
    _event: asyncio.Event = field(default_factory=asyncio.Event)

    def applies(self, caller: str, method: str, path: str, body: bytes) -> bool:
        if self.released:
            return False
        if self.callers is not None and caller not in self.callers:
            return False
        if self.methods is not None and method not in self.methods:
            return False
        if self.paths is not None and not any(path.startswith(p) for p in self.paths):
            return False
        return not self.containing or any(text in body for text in self.containing)

    def release(self) -> None:
        self.gate._call(self._release)

    def again(self) -> None:
        """Hold again: the requests released go on, the next ones wait."""
        self.gate._call(self._again)

    def _release(self) -> None:
        self.released = True
        self._event.set()

    def _again(self) -> None:
        if self.released:
            self.released = False
            self._event = asyncio.Event()


class Gate:
    """Parameters: `upstream` (base URL). Use as a context manager."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.holds: list[Hold] = []
        self.failing: tuple[int, str, tuple[str, ...]] | None = None
        self._counts: dict[str, Count] = {}
        self.answered: list[Answered] = []  # in the order they were answered
        self._urls: dict[str, str] = {}
        self._runners: list[web.AppRunner] = []
        self._loop = asyncio.new_event_loop()
        self._session: aiohttp.ClientSession | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="gate", daemon=True)

    # -- life ----------------------------------------------------------------

    def __enter__(self) -> Gate:
        self._thread.start()
        self._call(self._open_session)
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()
        self._call(self._close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _call(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` (sync or async) on the gate's loop and return its result."""
        async def run() -> Any:
            result = fn()
            return await result if asyncio.iscoroutine(result) else result
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(30)

    async def _open_session(self) -> None:
        self._session = aiohttp.ClientSession(
            auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None),
            connector=aiohttp.TCPConnector(limit=0))

    async def _close(self) -> None:
        for runner in self._runners:
            await runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def url(self, caller: str = "") -> str:
        """The gate's address for `caller` (a port of its own, opened on first use)."""
        if caller not in self._urls:
            self._urls[caller] = self._call(lambda: self._listen(caller))
        return self._urls[caller]

    async def _listen(self, caller: str) -> str:
        app = web.Application(client_max_size=1 << 30)

        async def handle(request: web.Request) -> web.StreamResponse:
            return await self._handle(caller, request)

        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self._runners.append(runner)
        port = runner.addresses[0][1]
        return f"http://127.0.0.1:{port}"

    # -- rules -----------------------------------------------------------------

    def hold(self, *, callers: Iterable[str] | None = None, after: int = 0,
             containing: Iterable[str] = (), paths: Iterable[str] | None = (CHAT,),
             methods: Iterable[str] | None = None) -> Hold:
        """Hold the requests of `callers` (all: None) to `paths` (prefixes;
        None: any) by `methods` (None: any) whose body contains one of
        `containing` (empty: any body), after the first `after` of them."""
        rule = self._call(lambda: Hold(
            self, frozenset(callers) if callers is not None else None,
            tuple(paths) if paths is not None else None,
            frozenset(methods) if methods is not None else None,
            tuple(t.encode() for t in containing), after))
        self.holds.append(rule)
        return rule

    def release(self) -> None:
        """Release every hold."""
        for rule in self.holds:
            rule.release()

    def fail(self, status: int, message: str, *, paths: Iterable[str] = (CHAT,)) -> None:
        """Answer every request to `paths` with an OpenAI-style error."""
        self.failing = (status, message, tuple(paths))

    def pass_through(self) -> None:
        self.failing = None

    # -- counters ----------------------------------------------------------------

    def count(self, caller: str | None = None) -> Count:
        """The counters of `caller`, or summed over every caller."""
        if caller is not None:
            return Count(**vars(self._counts.get(caller, Count())))
        total = Count()
        for count in list(self._counts.values()):
            for name, value in vars(count).items():
                setattr(total, name, getattr(total, name) + value)
        return total

    def wait(self, condition: Callable[[], Any], timeout_s: float, what: str) -> Any:
        """Poll `condition` until it is true; its value, or AssertionError."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = condition()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {timeout_s}s ({self._counts})")
            time.sleep(0.05)  # the poll of this wait loop

    # -- the proxy ------------------------------------------------------------------

    async def _handle(self, caller: str, request: web.Request) -> web.StreamResponse:
        count = self._counts.setdefault(caller, Count())
        count.seen += 1
        body = await request.read()
        failure = self._failure(count, request)
        if failure is not None:
            return failure
        count.pending += 1
        try:
            for rule in self.holds:
                if not rule.applies(caller, request.method, request.path, body):
                    continue
                rule.matched += 1
                if rule.matched > rule.after and not await self._held(rule, count, request):
                    count.abandoned += 1
                    return web.Response(status=499)
                # released into a failing server: it fails like any new request
                failure = self._failure(count, request)
                if failure is not None:
                    return failure
            return await self._forward(caller, count, request, body)
        finally:
            count.pending -= 1

    def _failure(self, count: Count, request: web.Request) -> web.Response | None:
        """The error answer while `fail` is in force for this path, else None."""
        failing = self.failing
        if failing is None or not any(request.path.startswith(p) for p in failing[2]):
            return None
        count.failed += 1
        status, message = failing[0], failing[1]
        return web.json_response({"object": "error", "message": message,
                                  "type": "BadRequestError", "param": None,
                                  "code": status}, status=status)

    async def _held(self, rule: Hold, count: Count, request: web.Request) -> bool:
        """Wait for the rule's release; False if the client hung up first."""
        released = rule._event  # this hold's, even if the rule holds again later
        rule.held += 1
        count.held += 1
        try:
            while not released.is_set():
                transport = request.transport
                if transport is None or transport.is_closing():
                    return False
                try:
                    await asyncio.wait_for(released.wait(), 0.1)
                except asyncio.TimeoutError:
                    pass  # look at the client again
            return True
        finally:
            rule.held -= 1
            count.held -= 1

    async def _forward(self, caller: str, count: Count, request: web.Request, body: bytes
                       ) -> web.StreamResponse:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        async with self._session.request(
                request.method, self.upstream + request.path_qs, data=body, headers=headers,
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
                allow_redirects=False) as answer:
            data = await answer.read()
            out = web.Response(status=answer.status, body=data if data else None)
            for name, value in answer.headers.items():
                if name.lower() not in HOP_HEADERS:
                    out.headers.add(name, value)
            if request.method == "HEAD" and "Content-Length" in answer.headers:
                out.headers["Content-Length"] = answer.headers["Content-Length"]
        count.answered += 1
        self.answered.append(Answered(caller, request.method, request.path, answer.status, body))
        return out
