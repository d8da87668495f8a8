"""Generation dispatch: start requests up to the in-flight limit, taking the
held partitions' fetched inputs in turn, and put each finished request's
result behind its partition's watermark (consumer/generation.py sends,
retries and classifies; consumer/turn_chain.py says what is sent and what
a result commits). Requests run as tasks on the worker's loop, never
blocking the poll loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from consumer.errors import FatalWorkerError
from consumer.generation import Generator, Outcome, ServerRefuses
from consumer.metrics import ConsumerMetrics
from consumer.ownership import Ownership
from consumer.partitions import Input, PartitionState
from consumer.turn_chain import TurnChain


class Dispatch:
    """Parameters: `ownership` (the held partitions), `chain`, `metrics`,
    `wake` (a result is in), `on_fatal` (the server refuses every request)."""

    def __init__(self, *, ownership: Ownership, chain: TurnChain, metrics: ConsumerMetrics,
                 wake: Callable[[], None], on_fatal: Callable[[BaseException], None]) -> None:
        self.ownership = ownership
        self.chain = chain
        self.metrics = metrics
        self._wake = wake
        self._on_fatal = on_fatal
        self._generator: Generator | None = None
        self.latency_s = 0.0  # moving average of request latency

    def use(self, generator: Generator) -> None:
        self._generator = generator

    def observe_latency(self, seconds: float) -> None:
        self.metrics.latency.observe(seconds)
        self.latency_s = seconds if not self.latency_s else 0.9 * self.latency_s + 0.1 * seconds

    def start(self, *, limit: int, draining: Callable[[str], bool]) -> None:
        """Start requests until `limit` are in flight, one partition after
        the other; none on a slot that is `draining` (handing over)."""
        loop = asyncio.get_running_loop()
        in_flight = self.ownership.in_flight
        while in_flight < limit:
            started = False
            for state in self.ownership.states():
                if in_flight >= limit:
                    break
                if not state.queue or draining(state.slot):
                    continue
                offset, item = state.queue.popleft()
                state.tasks[offset] = loop.create_task(self._generate(state, offset, item))
                in_flight += 1
                started = True
            if not started:
                break
        self.metrics.in_flight.set(in_flight)

    async def _generate(self, state: PartitionState, offset: int, item: Input) -> None:
        assert self._generator is not None, "use() first"
        try:
            outcome: Outcome = await self._generator.generate(self.chain.request(item))
        except asyncio.CancelledError:
            return  # revoked, lost or moved: the state was dropped already
        except ServerRefuses as exc:
            self._on_fatal(FatalWorkerError(str(exc)))
            return
        if not self.ownership.current(state):
            return  # dropped while finishing
        state.tasks.pop(offset, None)
        state.retries += outcome.retries
        state.watermark.finish(offset, self.chain.output(item, outcome.record))
        self._wake()
