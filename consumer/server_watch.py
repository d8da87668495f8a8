"""The SGLang server as the worker sees it: whether it answers (the health
gate, consumer/health.py), whether it fails every request the same way
(the circuit breaker, consumer/breaker.py), its last /metrics reading, and
so the in-flight limit: fixed, or with `--concurrency auto` steered by
/metrics towards a small non-empty server queue (consumer/concurrency.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from consumer.breaker import Breaker
from consumer.concurrency import AutoBounds, next_limit, parse_metrics
from consumer.config import WorkerConfig
from consumer.errors import FatalWorkerError
from consumer.health import HealthGate
from consumer.metrics import ConsumerMetrics
from consumer.sglang_client import SGLangClient
from schemas import RunSpec
from schemas.progress import ServerSnapshot
from tokenmill.log import get_logger

log = get_logger("tokenmill.consumer")


class ServerWatch:
    """Parameters: `config`, `spec` (the run: its max_tokens must fit the
    server's context), `metrics`, `wake` (the loop has something to do),
    `on_breaker` (the breaker opened or closed)."""

    def __init__(self, *, config: WorkerConfig, spec: RunSpec, metrics: ConsumerMetrics,
                 wake: Callable[[], None], on_breaker: Callable[[], None]) -> None:
        self.config = config
        self.spec = spec
        self.metrics = metrics
        self._wake = wake
        self._on_breaker = on_breaker
        self.auto = config.concurrency is None
        self.limit = config.concurrency or config.initial_concurrency
        self.snapshot: ServerSnapshot | None = None  # the last /metrics reading
        self.breaker = Breaker(window=config.breaker_window, threshold=config.breaker_threshold,
                               cooldown_s=config.breaker_cooldown_s,
                               max_cooldown_s=config.breaker_max_cooldown_s)
        self._gate: HealthGate | None = None

    @property
    def gate(self) -> HealthGate:
        assert self._gate is not None, "start() first"
        return self._gate

    @property
    def serving(self) -> bool:
        """Requests may start: the server answers (or is not watched yet)."""
        return self._gate is None or self._gate.is_open

    @property
    def up(self) -> bool:
        """Worth fetching for: the server answers and the breaker is closed."""
        return self.serving and self.breaker.state == "closed"

    @property
    def breaker_cause(self) -> str:
        """The failure cause while the breaker holds prompts, else ""."""
        return (self.breaker.cause or "") if self.breaker.state != "closed" else ""

    async def start(self, client: SGLangClient) -> None:
        """Open the health gate, refuse a server no prompt fits, and start an
        auto limit at the server's own capacity."""
        self.metrics.limit.set(self.limit)
        self.metrics.server_up.set(1)
        self._gate = HealthGate(client.healthy, interval_s=self.config.health_interval_s,
                                on_change=self._on_server_change)
        await self._check_server(client)
        if self.auto:
            await self._initial_auto_limit(client)

    def close(self) -> None:
        if self._gate is not None:
            self._gate.close()

    async def watch(self, client: SGLangClient, in_flight: Callable[[], int],
                    stopping: Callable[[], bool]) -> None:
        """Read the server's /metrics (every second with --concurrency auto,
        else every 5 s): the auto controller's input, and the snapshot every
        commit carries for `tokenmill status`."""
        bounds = AutoBounds(maximum=self.config.max_concurrency)
        interval = self.config.auto_interval_s if self.auto else 5.0
        server_max = await client.max_running_requests()
        warned = False
        while not stopping():
            await asyncio.sleep(interval)
            text = await client.metrics_text()
            load = parse_metrics(text) if text else None
            if load is None:
                if self.auto and not warned:
                    log.warning("no SGLang metrics at /metrics (start SGLang with "
                                "--enable-metrics); keeping the in-flight limit", limit=self.limit)
                    warned = True
                continue
            self.snapshot = ServerSnapshot(
                running=load.running, queued=load.queued, token_usage=load.token_usage,
                gen_throughput=load.gen_throughput, accept_length=load.accept_length,
                max_running_requests=server_max, at=time.time())
            if not self.auto:
                continue
            new = next_limit(self.limit, load, in_flight(), bounds)
            if new != self.limit:
                log.debug("in-flight limit", old=self.limit, new=new, running=load.running,
                          queued=load.queued, token_usage=load.token_usage)
                self.limit = new
                self.metrics.limit.set(new)
                self._wake()

    def on_breaker(self, state: str, cause: str | None) -> None:
        """The generator's report that the breaker opened or closed."""
        self.metrics.breaker_open.set(1 if state == "open" else 0)
        self._on_breaker()
        self._wake()

    async def _initial_auto_limit(self, client: SGLangClient) -> None:
        """Start at the server's own max running requests when it says so."""
        server_max = await client.max_running_requests()
        if server_max is not None:
            self.limit = max(1, min(self.config.max_concurrency, server_max))
            self.metrics.limit.set(self.limit)

    async def _check_server(self, client: SGLangClient) -> None:
        """What can be known up front: a context length that leaves no room for
        a prompt fails every request, so refuse to start (one line)."""
        context = await client.context_length()
        max_tokens = self.spec.generation.max_tokens
        if context is not None and max_tokens >= context:
            raise FatalWorkerError(
                f"run {self.spec.run_id} asks for max_tokens {max_tokens}, but the server at "
                f"{self.config.sglang_url} has a context length of {context}: no prompt would "
                "fit. Start SGLang with a larger --context-length, or use a run with a smaller "
                "--max-tokens")

    def _on_server_change(self, healthy: bool) -> None:
        self.metrics.server_up.set(1 if healthy else 0)
        self._wake()
