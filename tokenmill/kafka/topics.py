"""Topic and consumer-group names, in one place."""

from __future__ import annotations

RUNS_TOPIC = "tokenmill.runs"


# Big enough for a long multi-turn prompt plus an 8K-token completion.
MAX_MESSAGE_BYTES = 8 * 1024 * 1024


def prompts_topic(run_id: str) -> str:
    return f"tokenmill.{run_id}.prompts"


def completions_topic(run_id: str) -> str:
    return f"tokenmill.{run_id}.completions"


def dlq_topic(run_id: str) -> str:
    return f"tokenmill.{run_id}.dlq"


def turns_topic(run_id: str) -> str:
    """`regenerate-turns` runs: conversations between two turns, consumed by
    the workers alongside the prompts (same group, same partition count)."""
    return f"tokenmill.{run_id}.turns"


def progress_topic(run_id: str) -> str:
    """Exact per-instance counters, written inside each service's transactions.
    One per run, so an open transaction of one run's crashed worker never
    holds back another run's committed reads."""
    return f"tokenmill.{run_id}.progress"


def transactional_id(run_id: str, role: str, instance: str | None = None) -> str:
    """Stable per process role and instance, so that a restart fences its
    predecessor (`tokenmill.<run>.producer`, `.consumer.<instance>`,
    `.sink.<instance>`)."""
    return f"tokenmill.{run_id}.{role}" + (f".{instance}" if instance else "")


def generate_group(run_id: str) -> str:
    return f"tokenmill.{run_id}.generate"


def sink_group(run_id: str) -> str:
    return f"tokenmill.{run_id}.sink"


# Run data must outlive a week-long job: keep it until the run is deleted.
RUN_TOPIC_CONFIG = {
    "retention.ms": "-1",
    "retention.bytes": "-1",
    "max.message.bytes": str(MAX_MESSAGE_BYTES),
}
# The registry and the progress topics: every reader reads them to the end
# (`status`, every worker's and sink's done-check every few seconds). Kafka
# compacts only closed segments, and by default a segment closes after 1 GB
# or 7 days, so a week-long run would keep every progress record it ever
# committed (7 workers committing every 2 s: ~600,000 records in 45 hours)
# and each read would scan them all. Rolling a segment every 10 minutes keeps
# what a reader scans to one value per key plus the last minutes.
COMPACTED_TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    "max.message.bytes": str(MAX_MESSAGE_BYTES),
    "segment.ms": str(10 * 60 * 1000),
    "min.cleanable.dirty.ratio": "0.1",
}
