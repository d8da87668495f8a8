"""`/metrics` in Prometheus text format, with SGLang's metric names and labels.

Names, types and help texts follow SGLang's ``srt/metrics/collector.py``:
scheduler gauges (``sglang:num_running_reqs`` ...) carry the scheduler labels
``engine_type``, ``model_name``, ``pp_rank``, ``tp_rank``; tokenizer counters
(``sglang:prompt_tokens_total`` ...) and the latency histogram carry
``model_name``. Hot-path accounting is plain integer adds; the exposition is
built only when scraped, through prometheus_client's own text writer.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from sglang_sim.capacity import Scheduler
from sglang_sim.config import SimulatorConfig

E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400,
               600, 1200, 1800, 2400)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class RequestStats:
    """Counters of finished requests (what SGLang's TokenizerMetricsCollector counts)."""

    def __init__(self) -> None:
        self.num_requests = 0
        self.num_aborted = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.cached_tokens = 0
        self.e2e_buckets = [0] * (len(E2E_BUCKETS) + 1)
        self.e2e_sum = 0.0
        self.spec_accept_length_sum = 0.0
        self.spec_accept_rate_sum = 0.0
        self.spec_requests = 0
        self.last_spec_accept_length = 0.0
        self.last_spec_accept_rate = 0.0

    def finished(self, prompt_tokens: int, generation_tokens: int, cached_tokens: int,
                 e2e_latency: float, aborted: bool = False) -> None:
        self.num_requests += 1
        if aborted:
            self.num_aborted += 1
        self.prompt_tokens += prompt_tokens
        self.generation_tokens += generation_tokens
        self.cached_tokens += cached_tokens
        self.e2e_buckets[bisect_left(E2E_BUCKETS, e2e_latency)] += 1
        self.e2e_sum += e2e_latency

    def spec(self, accept_length: float, accept_rate: float) -> None:
        self.spec_requests += 1
        self.spec_accept_length_sum += accept_length
        self.spec_accept_rate_sum += accept_rate


class SGLangCollector(Collector):
    """Builds SGLang-named metric families from the live server state."""

    def __init__(self, config: SimulatorConfig, scheduler: Scheduler, stats: RequestStats) -> None:
        self.config = config
        self.scheduler = scheduler
        self.stats = stats
        self.now = time.monotonic  # replaced by the server with loop.time
        self._spec_seen = (0, 0.0, 0.0)

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=["engine_type", "model_name", "pp_rank",
                                                      "tp_rank"])
        family.add_metric(["unified", self.config.model_name, "0", "0"], value)
        return family

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(name, doc, labels=["model_name"])
        family.add_metric([self.config.model_name], value)
        return family

    def _spec_window(self) -> tuple[float, float]:
        """Mean accept length / rate of requests finished since the last scrape."""
        s = self.stats
        n0, l0, r0 = self._spec_seen
        n = s.spec_requests - n0
        if n > 0:
            s.last_spec_accept_length = (s.spec_accept_length_sum - l0) / n
            s.last_spec_accept_rate = (s.spec_accept_rate_sum - r0) / n
            self._spec_seen = (s.spec_requests, s.spec_accept_length_sum, s.spec_accept_rate_sum)
        return s.last_spec_accept_length, s.last_spec_accept_rate

    def collect(self) -> Iterator[Metric]:
        sched, stats, cfg = self.scheduler, self.stats, self.config
        used = sched.used_tokens()
        yield self._gauge("sglang:num_running_reqs", "The number of running requests.",
                          sched.running)
        yield self._gauge("sglang:num_queue_reqs",
                          "The number of requests in the waiting queue.", sched.queued)
        yield self._gauge("sglang:num_used_tokens", "The number of used tokens.", used)
        yield self._gauge("sglang:token_usage", "The token usage.",
                          min(used / cfg.max_total_num_tokens, 1.0))
        yield self._gauge("sglang:gen_throughput", "The generation throughput (token/s).",
                          sched.throughput(self.now()))
        hit = stats.cached_tokens / stats.prompt_tokens if stats.prompt_tokens else 0.0
        yield self._gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", hit)
        yield self._gauge("sglang:max_total_num_tokens",
                          "Maximum total number of tokens in the KV cache pool.",
                          cfg.max_total_num_tokens)
        accept_length, accept_rate = self._spec_window()
        yield self._gauge("sglang:spec_accept_length",
                          "The average acceptance length of speculative decoding.",
                          accept_length)
        yield self._gauge("sglang:spec_accept_rate",
                          "The average acceptance rate of speculative decoding "
                          "(`accepted tokens / total draft tokens` in batch).", accept_rate)
        yield self._counter("sglang:prompt_tokens", "Number of prefill tokens processed.",
                            stats.prompt_tokens)
        yield self._counter("sglang:generation_tokens",
                            "Number of generation tokens processed.", stats.generation_tokens)
        yield self._counter("sglang:cached_tokens", "Number of cached prompt tokens.",
                            stats.cached_tokens)
        yield self._counter("sglang:num_requests", "Number of requests processed.",
                            stats.num_requests)
        yield self._counter("sglang:num_aborted_requests", "Number of requests aborted.",
                            stats.num_aborted)
        hist = HistogramMetricFamily("sglang:e2e_request_latency_seconds",
                                     "Histogram of End-to-end request latency in seconds",
                                     labels=["model_name"])
        cumulative = 0
        buckets: list[tuple[str, float]] = []
        for bound, count in zip((*E2E_BUCKETS, float("inf")), stats.e2e_buckets):
            cumulative += count
            buckets.append(("+Inf" if bound == float("inf") else str(float(bound)), cumulative))
        hist.add_metric([cfg.model_name], buckets, stats.e2e_sum)
        yield hist


class MetricsEndpoint:
    """Owns the registry; `render()` returns the exposition bytes."""

    def __init__(self, collector: SGLangCollector) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)

    def render(self) -> bytes:
        return generate_latest(self.registry)
