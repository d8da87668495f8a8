"""The worker's settings (`tokenmill consume` builds them from its flags)."""

from __future__ import annotations

import msgspec

from consumer.backoff import RetryPolicy
from tokenmill.kafka import clients, groups
from tokenmill.settings import Secret


class WorkerConfig(msgspec.Struct, frozen=True, kw_only=True):
    instance: str
    sglang_url: str
    concurrency: int | None = None  # None = auto from SGLang's /metrics
    max_concurrency: int = 1024
    initial_concurrency: int = 16
    commit_interval_s: float = 2.0
    commit_max_records: int = 5000
    retry: RetryPolicy = RetryPolicy()
    request_timeout_s: float = 1800.0
    drain_timeout_s: float = 60.0
    group_protocol: groups.GroupProtocol = "consumer"
    # KIP-848: set as the group's consumer.session.timeout.ms when given;
    # classic: the client's session.timeout.ms.
    session_timeout_s: float | None = None
    static_membership: bool = False  # classic protocol only
    fleet_balancing: bool = True  # KIP-848 only: capacity-weighted slots
    fleet_interval_s: float = 3.0
    park_s: float = 3.0
    until_done: bool = False
    done_check_interval_s: float = 3.0
    metrics_port: int = 0
    health_interval_s: float = 1.0
    auto_interval_s: float = 1.0
    # The broker's timeout of this worker's transactions (--transaction-timeout):
    # how long a worker that died inside one holds its partitions back.
    transaction_timeout_s: float = clients.TRANSACTION_TIMEOUT_S
    step_timeout_s: float = 20.0  # each transaction step's deadline
    # An idle worker still commits its counters this often: `status` sees it
    # alive, and a duplicate --instance that fenced it is noticed.
    heartbeat_s: float = 10.0
    breaker_window: int = 20  # recent requests the circuit breaker looks at
    breaker_threshold: float = 0.9  # share of one failure cause that opens it
    breaker_cooldown_s: float = 30.0  # before the first probe (doubles, up to the max)
    breaker_max_cooldown_s: float = 120.0  # the longest wait between probes
    stall_s: float = 120.0
    # A held partition silent this long (while fetching) with committed
    # records past where it would read: the client stopped fetching; exit
    # (consumer/fetch_watch.py).
    fetch_stall_s: float = 60.0
    api_key: Secret | None = None  # TOKENMILL_SGLANG_API_KEY; never printed
