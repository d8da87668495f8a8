"""Prometheus metrics of one sink instance, on a private registry.

`tokenmill_sink_records_in_total`, `..._s3_records_total`, `..._objects_total`,
`..._bytes_total`, `..._dlq_records_total{reason}`, `..._flushes_total{trigger}`,
`..._upload_seconds`, `..._commit_seconds`, `..._lag_records{partition}`,
`..._assigned_partitions`. Counters count committed work, except
`records_in` (records read).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class SinkMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.records_in = Counter("tokenmill_sink_records_in", "Records read from .completions.",
                                  registry=r)
        self.s3_records = Counter("tokenmill_sink_s3_records",
                                  "Training samples committed to S3.", registry=r)
        self.objects = Counter("tokenmill_sink_objects", "S3 objects written and committed.",
                               registry=r)
        self.bytes = Counter("tokenmill_sink_bytes", "Bytes of S3 objects written and committed.",
                             registry=r)
        self.dlq_records = Counter("tokenmill_sink_dlq_records",
                                   "Records committed to the DLQ topic.", ["reason"], registry=r)
        self.flushes = Counter("tokenmill_sink_flushes",
                               "Batches flushed, by the predicate that sealed them.", ["trigger"],
                               registry=r)
        self.conflicts = Counter("tokenmill_sink_conflicts",
                                 "Conditional writes lost to another writer (batch replayed).",
                                 registry=r)
        self.aborts = Counter("tokenmill_sink_aborted_commits",
                              "Flush transactions aborted (batches replayed).", registry=r)
        self.upload_seconds = Histogram("tokenmill_sink_upload_seconds",
                                        "Time to upload one object.", buckets=LATENCY_BUCKETS,
                                        registry=r)
        self.commit_seconds = Histogram("tokenmill_sink_commit_seconds",
                                        "Time of one flush transaction, begin to commit.",
                                        buckets=LATENCY_BUCKETS, registry=r)
        self.lag = Gauge("tokenmill_sink_lag_records",
                         "High watermark minus position, per assigned partition (offsets, so "
                         "transaction markers count too).", ["partition"], registry=r)
        self.assigned = Gauge("tokenmill_sink_assigned_partitions",
                              "Partitions this instance owns.", registry=r)

    def serve(self, port: int, addr: str = "0.0.0.0") -> Any:
        """Start the /metrics HTTP server in a daemon thread; returns the server."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return server
