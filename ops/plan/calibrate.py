"""The calibration workload: the sample's prompts sent to one real server,
holding a rising number of requests in flight, within a time budget.

1. Sweep: for each concurrency level (ascending), hold exactly that many
   requests in flight for the level's duration, starting a new request
   whenever one finishes. Requests cross level boundaries; rates.py sorts
   that out. Low levels leave most of the server idle, so they get the
   shorter durations (see `level_durations`).
2. The sample first: every sample prompt is sent once, in sample order;
   when all have been sent, earlier ones are sent again (repeats keep the
   level's concurrency, count for throughput, not for lengths). If the sweep
   ends before every sample prompt was sent, the top level is held until
   they have been.
3. Drain: no new requests; wait for the sample's answers.
4. At the budget's end (or Ctrl-C, or too many failures) whatever still runs
   is cancelled and recorded as unfinished.

Requests use the consumer's own client and request body
(consumer/sglang_client.py), with the largest candidate max_tokens.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from consumer.sglang_client import (
    Generated,
    PromptRejected,
    Retryable,
    ServerRefused,
    ServerUnavailable,
    SGLangClient,
)

MAX_ATTEMPTS = 3  # per sample prompt, for transient failures
UNAVAILABLE_PAUSE_S = 0.5  # before replacing a request the server refused to take


@dataclass
class Request:
    """One calibration request; `end` None while running."""

    sample: int  # index into the sample's request bodies
    repeat: bool  # a repeat of an already sent prompt (throughput only)
    start: float
    end: float | None = None
    outcome: str = "running"  # stop | length | <other finish> | failed | rejected | unfinished
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str = ""


@dataclass
class LevelSpan:
    concurrency: int
    start: float
    end: float


@dataclass
class SweepResult:
    levels: list[LevelSpan]
    requests: list[Request]
    started: float
    ended: float
    interrupted: bool = False
    out_of_time: bool = False
    stopped_for_failures: bool = False
    unsent: int = 0  # sample prompts never sent

    def finished(self) -> list[Request]:
        return [r for r in self.requests if r.end is not None and r.outcome not in
                ("failed", "rejected", "unfinished")]


@dataclass
class SweepStatus:
    """What the progress bar shows."""

    level: int
    concurrency: int
    phase: str  # sweep | sending sample | draining
    elapsed: float
    answered: int  # sample prompts answered
    sample: int
    in_flight: int
    tokens: int  # output tokens received


@dataclass
class _State:
    pending: deque[int]
    attempts: dict[int, int] = field(default_factory=dict)
    answered: set[int] = field(default_factory=set)
    tasks: dict[asyncio.Task[None], Request] = field(default_factory=dict)
    failures: int = 0
    tokens: int = 0


def level_durations(levels: list[int], total_s: float) -> list[float]:
    """`total_s` split over the levels in proportion to sqrt(concurrency): a
    level below the knee leaves most of the server idle, and every second
    there is a second the sample's answers are not being generated."""
    weights = [math.sqrt(c) for c in levels]
    return [total_s * w / sum(weights) for w in weights]


class Sweep:
    """One calibration run (a Sweep runs once)."""

    # set when run() starts
    _loop: asyncio.AbstractEventLoop
    _started: float
    _deadline: float
    _stop: asyncio.Event
    _state: _State
    _requests: list[Request]
    _fatal: BaseException | None = None  # a failure that ends calibration (401/403/404)

    def __init__(self, client: SGLangClient, bodies: list[dict[str, Any]], levels: list[int], *,
                 durations: list[float], budget_s: float, max_failures: int | None = None,
                 on_status: Callable[[SweepStatus], None] | None = None) -> None:
        if not bodies:
            raise ValueError("no prompts to calibrate with")
        if len(durations) != len(levels):
            raise ValueError("one duration per level")
        self.client = client
        self.bodies = bodies
        self.levels = levels
        self.durations = durations
        self.budget_s = budget_s
        self.max_failures = max_failures if max_failures is not None else max(20, len(bodies) // 5)
        self.on_status = on_status
        self._rid = itertools.count()
        self._repeat = itertools.cycle(range(len(bodies)))
        self._phase = "sweep"
        self._level = 0
        self._target = 0
        self._launching = True
        self._wake = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> SweepResult:
        loop = asyncio.get_running_loop()
        self._loop = loop
        started = self._started = loop.time()
        self._deadline = started + self.budget_s
        self._stop = stop
        state = self._state = _State(pending=deque(range(len(self.bodies))))
        requests: list[Request] = []
        self._requests = requests
        spans: list[LevelSpan] = []
        result = SweepResult(spans, requests, started, started)
        try:
            for index, concurrency in enumerate(self.levels):
                self._level, self._target = index, concurrency
                span = LevelSpan(concurrency, loop.time(), loop.time())
                spans.append(span)
                self._fill()
                await self._wait_until(loop.time() + self.durations[index], lambda: False)
                span.end = loop.time()
                if self._over(result):
                    break
            else:
                self._phase = "sending sample"
                top = spans[-1]
                await self._wait_until(self._deadline, lambda: not state.pending)
                top.end = loop.time()
                if not self._over(result):
                    self._phase = "draining"
                    self._launching = False
                    await self._wait_until(self._deadline, lambda: not state.tasks)
                    self._over(result)
        finally:
            await self._cancel_all()
            result.ended = loop.time()
            result.unsent = len(state.pending)
            self._report()
        return result

    # ------------------------------------------------------------ control
    def _over(self, result: SweepResult) -> bool:
        """Whether to stop now; records why."""
        if self._stop.is_set():
            result.interrupted = True
        elif self._loop.time() >= self._deadline:
            result.out_of_time = True
        elif self._state.failures >= self.max_failures:
            result.stopped_for_failures = True
        else:
            return False
        return True

    async def _wait_until(self, until: float, done: Callable[[], bool]) -> None:
        """Sleep until `until`, `done()`, the budget's end, a stop or too many
        failures, waking on every finished request and twice a second."""
        while not done():
            now = self._loop.time()
            if (now >= min(until, self._deadline) or self._stop.is_set()
                    or self._state.failures >= self.max_failures):
                return
            self._wake.clear()
            self._report()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=min(0.5, until - now + 1e-3))
            except asyncio.TimeoutError:
                pass

    def _fill(self) -> None:
        while self._launching and len(self._state.tasks) < self._target:
            self._launch()

    def _launch(self) -> None:
        state = self._state
        if state.pending:
            sample, repeat = state.pending.popleft(), False
        else:
            sample, repeat = next(self._repeat), True
        body = dict(self.bodies[sample])
        body["rid"] = f"{body.get('rid', 'plan')}.plan{next(self._rid)}"
        request = Request(sample=sample, repeat=repeat, start=self._loop.time())
        self._requests.append(request)
        task = asyncio.ensure_future(self._send(request, body))
        state.tasks[task] = request
        task.add_done_callback(self._finished)

    async def _send(self, request: Request, body: dict[str, Any]) -> None:
        unavailable = False
        try:
            generated: Generated = await self.client.chat(body)
        except PromptRejected as exc:
            request.outcome, request.error = "rejected", f"{exc.kind}: {exc}"
            return
        except (Retryable, ServerRefused, ServerUnavailable) as exc:
            request.outcome, request.error = "failed", str(exc)
            unavailable = isinstance(exc, ServerUnavailable)
            return
        finally:
            request.end = self._loop.time()
            if unavailable:  # do not hammer a server that is down
                await asyncio.sleep(UNAVAILABLE_PAUSE_S)
        request.outcome = generated.finish_reason
        request.prompt_tokens = generated.usage.prompt_tokens
        request.completion_tokens = generated.usage.completion_tokens

    def _finished(self, task: asyncio.Task[None]) -> None:
        state = self._state
        request = state.tasks.pop(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            request.outcome, request.error = "failed", f"{type(error).__name__}: {error}"
            self._fatal = error
            self._stop.set()
        if request.outcome == "failed":
            state.failures += 1
            if not request.repeat:
                state.attempts[request.sample] = state.attempts.get(request.sample, 1) + 1
                if state.attempts[request.sample] <= MAX_ATTEMPTS:
                    state.pending.appendleft(request.sample)
        elif request.outcome == "rejected":
            state.failures += 1
        else:
            state.tokens += request.completion_tokens
            if not request.repeat:
                state.answered.add(request.sample)
        self._fill()
        self._wake.set()

    async def _cancel_all(self) -> None:
        tasks = list(self._state.tasks)
        now = self._loop.time()
        for task in tasks:
            request = self._state.tasks[task]
            request.end, request.outcome = now, "unfinished"
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._fatal is not None:
            raise self._fatal

    def _report(self) -> None:
        if self.on_status is None:
            return
        state = self._state
        self.on_status(SweepStatus(
            level=self._level, concurrency=self._target, phase=self._phase,
            elapsed=self._loop.time() - self._started,
            answered=len(state.answered), sample=len(self.bodies), in_flight=len(state.tasks),
            tokens=state.tokens))
