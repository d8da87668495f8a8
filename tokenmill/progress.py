"""Exact run progress from the run's `tokenmill.<run>.progress` topic (see
schemas/progress.py): the producer's checkpoint and the sum of every
consumer's and sink's committed counters."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from schemas.progress import (
    ConsumerProgress,
    ProducerCheckpoint,
    SinkProgress,
    decode_progress,
    producer_key,
)
from tokenmill.kafka import clients, compacted, topics
from tokenmill.settings import Settings

# How long a look at the run waits for open transactions (members commit
# every second or so; longer means one died mid-commit).
LOOK_SETTLE_S = 3.0
# ... and a glance (`status`, a member's done-check, every few seconds): what
# is decided is at most one commit behind and only ever undercounts, so a
# glance never says "done" early; waiting for commits in flight made every
# glance on a busy fleet cost 3 s more (the seed run: status up to 11 s).
GLANCE_SETTLE_S = 0.5


@dataclass
class RunProgress:
    run: str
    producer: ProducerCheckpoint | None = None
    consumers: dict[str, ConsumerProgress] = field(default_factory=dict)
    sinks: dict[str, SinkProgress] = field(default_factory=dict)

    @property
    def published(self) -> int:
        return self.producer.next_seq if self.producer else 0

    @property
    def publishing_done(self) -> bool:
        return bool(self.producer and self.producer.done)

    @property
    def generated(self) -> int:
        """Committed records in `.completions` (completions + failures)."""
        return sum(c.completions + c.failures for c in self.consumers.values())

    @property
    def persisted(self) -> int:
        """Records the sink committed: S3 lines + DLQ records, less the
        `invalid` ones (records that were never published prompts)."""
        return sum(s.s3_records + s.dlq_records - s.dlq_by_reason.get("invalid", 0)
                   for s in self.sinks.values())

    @property
    def generation_done(self) -> bool:
        return self.publishing_done and self.generated >= self.published

    @property
    def sink_done(self) -> bool:
        return self.publishing_done and self.persisted >= self.published

    def consumer_total(self, name: str) -> int | float:
        """The sum of one numeric field of ConsumerProgress over the workers."""
        total: int | float = sum(getattr(c, name) for c in self.consumers.values())
        return total

    def consumer_counter(self, name: str) -> Counter[str]:
        total: Counter[str] = Counter()
        for c in self.consumers.values():
            total.update(getattr(c, name))
        return total

    def sink_counter(self, name: str) -> Counter[str]:
        total: Counter[str] = Counter()
        for s in self.sinks.values():
            total.update(getattr(s, name))
        return total


def ensure_topic(settings: Settings, run_id: str) -> None:
    clients.ensure_topics(
        clients.admin(settings), {topics.progress_topic(run_id): 1},
        topics.COMPACTED_TOPIC_CONFIG,
    )


def read_run_progress(settings: Settings, run_id: str, settle_s: float = LOOK_SETTLE_S,
                      admin: AdminClient | None = None) -> RunProgress:
    """Every member's progress, for looking at the run: if a transaction
    stays open past `settle_s` (its owner died mid-commit), what is decided
    so far. A member's own state is read with `read_one`, which waits.
    `admin`: the look's client for the offset lookups, else a new one."""
    raw = compacted.read_to_end(settings, topics.progress_topic(run_id), _of_run(run_id),
                               settle_s=settle_s, stale_ok=True, admin=admin)
    return _run_progress(run_id, raw)


def _of_run(run_id: str) -> Callable[[str], bool]:
    prefix = f"{run_id}/"
    return lambda key: key.startswith(prefix)


def _run_progress(run_id: str, raw: dict[str, bytes]) -> RunProgress:
    progress = RunProgress(run=run_id)
    for value in raw.values():
        record = decode_progress(value)
        if isinstance(record, ProducerCheckpoint):
            progress.producer = record
        elif isinstance(record, ConsumerProgress):
            progress.consumers[record.instance] = record
        else:
            progress.sinks[record.instance] = record
    return progress


def read_one(settings: Settings, key: str) -> bytes | None:
    """The last committed value of one key, after every transaction open
    when the read starts is decided: what a restarted member resumes from."""
    run_id = key.split("/", 1)[0]
    return compacted.read_to_end(settings, topics.progress_topic(run_id),
                                 lambda k: k == key, few_keys=True).get(key)


def read_producer_checkpoint(settings: Settings, run_id: str) -> ProducerCheckpoint | None:
    value = read_one(settings, producer_key(run_id))
    return msgspec.json.decode(value, type=ProducerCheckpoint) if value else None


class ProgressUnavailable(RuntimeError):
    """The progress topic could not be read just now (broker down, leaders
    moving): try again later."""


class ProgressTail:
    """Glances at the run, again and again (a member's done check): each
    reads only what was committed since the last (compacted.Tail)."""

    def __init__(self, settings: Settings, run_id: str) -> None:
        self.run_id = run_id
        self._tail = compacted.Tail(settings, topics.progress_topic(run_id), _of_run(run_id),
                                    settle_s=GLANCE_SETTLE_S)

    def glance(self) -> RunProgress:
        """Every failure of the read is ProgressUnavailable; the next glance
        goes on from what was read."""
        try:
            return _run_progress(self.run_id, self._tail.look())
        except (KafkaException, TimeoutError, RuntimeError) as exc:
            raise ProgressUnavailable(str(exc.args[0] if exc.args else exc)) from None

    def close(self) -> None:
        self._tail.close()
