"""The consumer's Prometheus metrics, on a registry of its own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


class ConsumerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.completions = Counter("tokenmill_consumer_completions", "Committed completions",
                                   ["finish_reason"], registry=r)
        self.failures = Counter("tokenmill_consumer_failures", "Committed failure records",
                                ["kind"], registry=r)
        self.retries = Counter("tokenmill_consumer_retries", "Request retries", ["kind"],
                               registry=r)
        self.prompt_tokens = Counter("tokenmill_consumer_prompt_tokens", "Prompt tokens",
                                     registry=r)
        self.completion_tokens = Counter("tokenmill_consumer_completion_tokens",
                                         "Completion tokens", registry=r)
        self.in_flight = Gauge("tokenmill_consumer_in_flight", "Requests in flight", registry=r)
        self.limit = Gauge("tokenmill_consumer_concurrency_limit", "In-flight limit", registry=r)
        self.accept_length = Gauge("tokenmill_consumer_spec_accept_length",
                                   "Mean speculative accept length of the last commit", registry=r)
        self.committed_offset = Gauge("tokenmill_consumer_committed_offset",
                                      "Committed input offset", ["partition"], registry=r)
        self.lag = Gauge("tokenmill_consumer_lag", "High watermark minus committed offset "
                         "(approximate: transaction markers take offsets)", ["partition"],
                         registry=r)
        self.waiting = Gauge("tokenmill_consumer_waiting_results",
                             "Finished results held behind an unfinished offset", registry=r)
        self.wasted = Counter("tokenmill_consumer_wasted_generations",
                              "Generations thrown away (cancelled or never committed)",
                              ["reason"], registry=r)
        self.commits = Counter("tokenmill_consumer_transactions", "Transactions", ["result"],
                               registry=r)
        self.commit_seconds = Histogram("tokenmill_consumer_commit_seconds",
                                        "Transaction commit latency", registry=r)
        self.latency = Histogram("tokenmill_consumer_request_seconds", "Request latency",
                                 buckets=(0.1, 0.5, 1, 5, 15, 30, 60, 120, 300, 600, 1200),
                                 registry=r)
        self.server_up = Gauge("tokenmill_consumer_server_up", "1 while the SGLang server answers",
                               registry=r)
        self.breaker_open = Gauge("tokenmill_consumer_breaker_open",
                                  "1 while the circuit breaker holds prompts (the server fails "
                                  "every request the same way)", registry=r)
        self.slots = Gauge("tokenmill_consumer_slots", "Group members this worker runs "
                           "(its share of partitions follows its capacity)", registry=r)
        self.assigned = Gauge("tokenmill_consumer_assigned_partitions", "Assigned partitions",
                              registry=r)

    def serve(self, port: int, host: str = "0.0.0.0") -> None:
        start_http_server(port, addr=host, registry=self.registry)
