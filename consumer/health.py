"""The server gate: closed while the SGLang server is down or loading.

Requests that hit a dead server wait here instead of failing: that is not
the prompt's fault and must not turn a partition into failures. One probe
task polls /health until it answers 200, then opens the gate.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from consumer.sglang_client import ServerUnavailable, SGLangClient
from tokenmill.log import get_logger
from tokenmill.settings import Secret
from tokenmill.startup import StartupWait, wait_until_up_async

log = get_logger("tokenmill.consumer.health")


class HealthGate:
    def __init__(self, probe: Callable[[], Awaitable[bool]], *, interval_s: float = 1.0,
                 on_change: Callable[[bool], None] | None = None) -> None:
        self._probe = probe
        self._interval = interval_s
        self._open = asyncio.Event()
        self._open.set()
        self._probing: asyncio.Task[None] | None = None
        self._on_change = on_change
        self.outages = 0
        self.down_since: float | None = None

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    async def wait_open(self) -> None:
        await self._open.wait()

    def report_down(self, reason: str) -> None:
        if not self._open.is_set():
            return
        self._open.clear()
        self.outages += 1
        self.down_since = time.monotonic()
        log.warning("SGLang server unavailable; pausing consumption", reason=reason)
        if self._on_change:
            self._on_change(False)
        self._probing = asyncio.get_running_loop().create_task(self._probe_until_healthy())

    async def _probe_until_healthy(self) -> None:
        last_log = time.monotonic()
        while True:
            await asyncio.sleep(self._interval)
            if await self._probe():
                break
            if time.monotonic() - last_log > 30:
                last_log = time.monotonic()
                log.warning("still waiting for the SGLang server",
                            down_for_s=round(time.monotonic() - (self.down_since or 0), 1))
        log.info("SGLang server healthy again; resuming",
                 down_for_s=round(time.monotonic() - (self.down_since or 0), 1))
        self.down_since = None
        self._open.set()
        if self._on_change:
            self._on_change(True)

    def close(self) -> None:
        if self._probing is not None:
            self._probing.cancel()


async def wait_for_server(url: str, *, timeout_s: float, api_key: Secret | None = None) -> None:
    """At start-up: wait (logged, bounded by the start-up timeout) until the
    server answers, before the worker joins the group and takes partitions."""
    async with SGLangClient(url, api_key=api_key, max_connections=1) as client:
        wait = StartupWait("the SGLang server", url, timeout_s=timeout_s,
                           hint="is it running? (start it, or point --sglang-url / "
                                "TOKENMILL_SGLANG_URL at it)")
        await wait_until_up_async(client.check_up, wait, down=(ServerUnavailable,))
