"""Capacity model over real HTTP: queueing, aggregate cap, time scale, live gauges.

Timings are compared as ratios between runs on the same machine, never as
absolute values, and only with simulated durations long enough (a second or
more) that the HTTP round trip of a loaded 2-core machine cannot decide a
ratio. Gauges are polled until a condition holds, never read at a fixed
moment.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import aiohttp
import pytest

from tests.simulator.sim_helpers import metric_values

pytestmark = pytest.mark.timeout(120)

# fixed-length answers: every request decodes exactly 200 tokens (length cut)
FIXED = {"length_min": 400, "length_max": 400, "prefill_rate": 0.0}


async def _burst(url: str, n: int, max_tokens: int = 200) -> list[float]:
    """Latencies of `n` concurrent requests (distinct prompts)."""
    async with aiohttp.ClientSession() as session:

        async def one(i: int) -> float:
            body = {"model": "m", "max_tokens": max_tokens,
                    "messages": [{"role": "user", "content": f"burst {n} {i}"}]}
            t0 = time.perf_counter()
            async with session.post(url + "/v1/chat/completions", json=body) as resp:
                data = await resp.json()
                assert resp.status == 200
                assert data["usage"]["completion_tokens"] == max_tokens
            return time.perf_counter() - t0

        return list(await asyncio.gather(*(one(i) for i in range(n))))


async def _gauges_while(url: str, burst: asyncio.Future[list[float]]) -> list[dict[str, float]]:
    """/metrics samples taken back to back until the burst is answered."""
    samples = []
    while not burst.done():
        samples.append(await asyncio.to_thread(metric_values, url))
        await asyncio.sleep(0.02)  # poll of a wait loop
    return samples


async def test_queueing_beyond_max_running(simulator: Callable[..., str]) -> None:
    # 4 slots, 200 tokens at 100 tok/s x 2 = 1 s per request
    url = simulator(max_running_requests=4, decode_rate=100.0, time_scale=2.0, **FIXED)
    at_limit = await _burst(url, 4)
    burst = asyncio.ensure_future(_burst(url, 16))
    samples = await _gauges_while(url, burst)
    over = await burst
    # 16 requests through 4 slots = 4 waves
    assert max(over) / max(at_limit) > 3.0
    assert (sum(over) / len(over)) / (sum(at_limit) / len(at_limit)) > 2.0
    # never more than 4 running; at some point 4 running with the rest queued
    assert max(s["sglang:num_running_reqs"] for s in samples) == 4
    full = [s for s in samples if s["sglang:num_running_reqs"] == 4
            and s["sglang:num_queue_reqs"] >= 8]
    assert full, [(s["sglang:num_running_reqs"], s["sglang:num_queue_reqs"]) for s in samples]
    assert all(s["sglang:token_usage"] > 0 for s in full)
    after = metric_values(url)
    assert after["sglang:num_running_reqs"] == 0 and after["sglang:num_queue_reqs"] == 0
    assert after["sglang:gen_throughput"] > 0


async def test_aggregate_token_cap_slows_everyone(simulator: Callable[..., str]) -> None:
    # alone: 200 tok/s real (1 s); 8 together share an 800 tok/s cap -> 100 each (2 s)
    url = simulator(max_running_requests=64, decode_rate=100.0, max_total_tok_s=400.0,
                    time_scale=2.0, **FIXED)
    alone = await _burst(url, 1)
    crowd = await _burst(url, 8)
    assert (sum(crowd) / len(crowd)) / alone[0] > 1.6


async def test_time_scale_speeds_up_simulated_time(simulator: Callable[..., str]) -> None:
    slow = simulator(decode_rate=100.0, time_scale=1.0, **FIXED)
    fast = simulator(decode_rate=100.0, time_scale=100.0, **FIXED)
    (t_slow,) = await _burst(slow, 1, max_tokens=100)  # 1 s of simulated decoding
    fastest = min([(await _burst(fast, 1, max_tokens=100))[0] for _ in range(3)])  # 10 ms
    # load only adds time: the slow one can never be early, and the fast one
    # stays far below it even with a loaded machine's round trips
    assert t_slow >= 0.95
    assert t_slow / fastest > 4


async def test_speculation_multiplies_the_decode_rate(simulator: Callable[..., str]) -> None:
    # plain: 200 tokens at 100 tok/s = 2 s; accept length 3 -> about 0.7 s
    plain = simulator(decode_rate=100.0, time_scale=1.0, **FIXED)
    spec = simulator(decode_rate=100.0, time_scale=1.0, speculative_accept_length=3.0, **FIXED)
    (t_plain,) = await _burst(plain, 1)
    (t_spec,) = await _burst(spec, 1)
    assert t_plain / t_spec > 2.0
    assert metric_values(spec)["sglang:spec_accept_length"] > 2.0
