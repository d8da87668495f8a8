"""Capacity model: a GPU server's scheduler, as a processor-sharing queue.

* At most ``max_running_requests`` requests hold a slot; the rest wait in a
  FIFO queue (``sglang:num_queue_reqs``).
* A request with a slot first prefills (``prompt_tokens / prefill_rate``),
  then decodes its completion tokens. Every decoding request runs at
  ``decode_rate * accept_length`` tok/s, unless the aggregate cap
  ``max_total_tok_s`` divided by the number of decoding requests is lower —
  so latency grows once concurrency passes the limit, as on a real GPU.
* All rates are in simulated time; ``time_scale`` maps them to real time
  (1000 = a simulated hour passes in 3.6 real seconds).

Decoding uses virtual time: all decoding requests progress at the same rate,
so one counter ``V`` (tokens each has received) and a heap of finish points
make joins, leaves and the next completion O(log n).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections import deque

import msgspec

from sglang_sim.config import SimulatorConfig

_THROUGHPUT_WINDOW = 5.0  # real seconds
_SAMPLE_EVERY = 0.25


class JobTimes(msgspec.Struct, kw_only=True):
    """Real-time stamps of one request through the scheduler (loop.time())."""

    queued_at: float
    admitted_at: float = 0.0
    first_token_at: float = 0.0
    finished_at: float = 0.0

    @property
    def queue_time(self) -> float:
        return self.admitted_at - self.queued_at


class _Decoding:
    __slots__ = ("done", "finish_v", "join_v", "prompt_tokens", "seq", "tokens")

    def __init__(self, finish_v: float, join_v: float, tokens: int, prompt_tokens: int,
                 done: asyncio.Future[None], seq: int) -> None:
        self.finish_v = finish_v
        self.join_v = join_v
        self.tokens = tokens
        self.prompt_tokens = prompt_tokens
        self.done = done
        self.seq = seq

    def __lt__(self, other: _Decoding) -> bool:
        return (self.finish_v, self.seq) < (other.finish_v, other.seq)


def per_request_rate(config: SimulatorConfig) -> float:
    """Real-time decode tok/s of one request alone (inf when decode is free)."""
    if config.zero_delay or config.decode_rate <= 0:
        return float("inf")
    return config.decode_rate * config.speculative_accept_length * config.time_scale


def aggregate_cap(config: SimulatorConfig) -> float:
    """Real-time decode tok/s across all requests (inf when uncapped)."""
    if config.zero_delay or config.max_total_tok_s <= 0:
        return float("inf")
    return config.max_total_tok_s * config.time_scale


def decode_rate_each(config: SimulatorConfig, decoding: int) -> float:
    """Rate every decoding request gets when `decoding` requests share the GPU."""
    rate = per_request_rate(config)
    cap = aggregate_cap(config)
    if decoding > 0 and cap != float("inf"):
        rate = min(rate, cap / decoding)
    return rate


def prefill_seconds(config: SimulatorConfig, prompt_tokens: int) -> float:
    """Real seconds the prefill of `prompt_tokens` takes."""
    if config.zero_delay or config.prefill_rate <= 0:
        return 0.0
    return prompt_tokens / (config.prefill_rate * config.time_scale)


class Scheduler:
    """Slots, FIFO queue and processor-shared decoding for one simulated server."""

    def __init__(self, config: SimulatorConfig) -> None:
        self.config = config
        self.max_running = config.max_running_requests
        self.running = 0  # slot holders (prefilling + decoding)
        self.prefilling_tokens = 0
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._heap: list[_Decoding] = []
        self._v = 0.0
        self._last = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._seq = itertools.count()
        self.generated = 0.0  # tokens decoded so far (fluid), for gen_throughput
        self._samples: deque[tuple[float, float]] = deque()

    # ------------------------------------------------------------ queries
    @property
    def queued(self) -> int:
        return len(self._waiting)

    @property
    def decoding(self) -> int:
        return len(self._heap)

    def used_tokens(self) -> int:
        """KV tokens held by running requests (prompt + decoded so far)."""
        total = self.prefilling_tokens
        v = self._current_v()
        for job in self._heap:
            total += job.prompt_tokens + int(min(job.tokens, v - job.join_v))
        return total

    def throughput(self, now: float) -> float:
        """Decoded tok/s (real time) over the last few seconds."""
        self._sample(now, force=True)
        if len(self._samples) < 2:
            return 0.0
        t0, g0 = self._samples[0]
        t1, g1 = self._samples[-1]
        return (g1 - g0) / (t1 - t0) if t1 > t0 else 0.0

    # ------------------------------------------------------------ requests
    async def run(self, prompt_tokens: int, completion_tokens: int,
                  first_token: asyncio.Event | None = None) -> JobTimes:
        """Wait for a slot, prefill, decode; returns the real-time stamps."""
        loop = asyncio.get_running_loop()
        times = JobTimes(queued_at=loop.time())
        await self._acquire(loop)
        times.admitted_at = loop.time()
        try:
            pre = prefill_seconds(self.config, prompt_tokens)
            if pre > 0:
                self.prefilling_tokens += prompt_tokens
                try:
                    await asyncio.sleep(pre)
                finally:
                    self.prefilling_tokens -= prompt_tokens
            times.first_token_at = loop.time()
            if first_token is not None:
                first_token.set()
            if completion_tokens > 0 and per_request_rate(self.config) != float("inf"):
                await self._decode(loop, prompt_tokens, completion_tokens)
            else:
                self.generated += completion_tokens
            times.finished_at = loop.time()
            return times
        finally:
            self._release()

    def count_instant(self, completion_tokens: int) -> None:
        """Account tokens of a request answered without the scheduler (zero delay)."""
        self.generated += completion_tokens

    async def _acquire(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.running < self.max_running and not self._waiting:
            self.running += 1
            return
        fut: asyncio.Future[None] = loop.create_future()
        self._waiting.append(fut)
        try:
            await fut  # the releaser hands its slot over (running stays counted)
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self._release()  # slot was handed over just before cancellation
            else:
                self._waiting.remove(fut)
            raise

    def _release(self) -> None:
        while self._waiting:
            fut = self._waiting.popleft()
            if not fut.done():
                fut.set_result(None)  # hand the slot over
                return
        self.running -= 1

    # ------------------------------------------------------------ decoding
    def _current_v(self) -> float:
        if not self._heap:
            return self._v
        loop = asyncio.get_running_loop()
        return self._v + decode_rate_each(self.config, len(self._heap)) * (loop.time() - self._last)

    def _advance(self, now: float) -> None:
        n = len(self._heap)
        if n:
            step = decode_rate_each(self.config, n) * (now - self._last)
            self._v += step
            self.generated += step * n
        self._last = now
        self._sample(now)

    def _sample(self, now: float, force: bool = False) -> None:
        if force or not self._samples or now - self._samples[-1][0] >= _SAMPLE_EVERY:
            if self._samples and now - self._samples[-1][0] < 1e-6:
                self._samples[-1] = (now, self.generated)
            else:
                self._samples.append((now, self.generated))
            while len(self._samples) > 2 and now - self._samples[0][0] > _THROUGHPUT_WINDOW:
                self._samples.popleft()

    async def _decode(self, loop: asyncio.AbstractEventLoop, prompt_tokens: int,
                      tokens: int) -> None:
        self._advance(loop.time())
        done: asyncio.Future[None] = loop.create_future()
        job = _Decoding(self._v + tokens, self._v, tokens, prompt_tokens, done, next(self._seq))
        heapq.heappush(self._heap, job)
        self._reschedule(loop)
        try:
            await done
        finally:
            if not done.done():  # cancelled: leave the GPU
                self._advance(loop.time())
                self._heap.remove(job)
                heapq.heapify(self._heap)
                self._reschedule(loop)

    def _on_timer(self) -> None:
        self._timer = None
        loop = asyncio.get_running_loop()
        self._advance(loop.time())
        while self._heap and self._heap[0].finish_v <= self._v + 1e-6:
            job = heapq.heappop(self._heap)
            # the rest of the rounding error goes to the finished job
            if not job.done.done():
                job.done.set_result(None)
        self._reschedule(loop)

    def _reschedule(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._heap:
            return
        rate = decode_rate_each(self.config, len(self._heap))
        delay = max((self._heap[0].finish_v - self._v) / rate, 0.0)
        self._timer = loop.call_at(self._last + delay, self._on_timer)
