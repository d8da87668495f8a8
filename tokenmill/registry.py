"""The run registry: immutable run specs in the compacted `tokenmill.runs`
topic, key = run id.

A spec is written once. Writing the same content again is a no-op; writing
different content under an existing id is refused, because every completion
of a run must come from one set of settings.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec
from confluent_kafka.admin import AdminClient

from schemas.run import RunSpec
from tokenmill.kafka import clients, compacted, topics
from tokenmill.log import get_logger
from tokenmill.settings import Settings

log = get_logger("tokenmill.registry")

_decoder = msgspec.json.Decoder(RunSpec)


class RunConflict(ValueError):
    """A run id is taken by a spec with different content."""


class UnknownRun(LookupError):
    """No spec is registered under this run id."""


def spec_differences(old: RunSpec, new: RunSpec) -> list[str]:
    """Dotted field paths whose values differ, for a readable refusal."""
    a = msgspec.to_builtins(old)
    b = msgspec.to_builtins(new)
    return _diff(a, b, "")


def _diff(a: object, b: object, path: str) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for key in sorted(set(a) | set(b)):
            out += _diff(a.get(key), b.get(key), f"{path}.{key}" if path else key)
        return out
    return [] if a == b else [f"{path}: {a!r} -> {b!r}"]


class RunRegistry:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._checked = False

    def _ensure_topic(self, admin: AdminClient | None) -> None:
        if not self._checked:
            clients.check_broker(self._settings)
            self._checked = True
        clients.ensure_topics(
            admin if admin is not None else clients.admin(self._settings),
            {topics.RUNS_TOPIC: 1},
            topics.COMPACTED_TOPIC_CONFIG,
        )

    def all(self, admin: AdminClient | None = None) -> dict[str, RunSpec]:
        """Every registered spec, read from the start of the compacted topic.
        `admin`: a client of the caller's for the lookups (a look that reads
        more than the registry shares one), else new ones."""
        self._ensure_topic(admin)
        raw = compacted.read_to_end(self._settings, topics.RUNS_TOPIC, admin=admin)
        return {run_id: _decoder.decode(value) for run_id, value in raw.items()}

    def get(self, run_id: str, specs: Mapping[str, RunSpec] | None = None) -> RunSpec:
        """The run's spec, from `specs` (a read of `all()` the caller made
        already) or read now; UnknownRun says how to create it."""
        spec = (self.all() if specs is None else specs).get(run_id)
        if spec is None:
            raise UnknownRun(
                f"run {run_id!r} is not registered in {topics.RUNS_TOPIC} at "
                f"{self._settings.bootstrap_servers}; "
                f"create it with `tokenmill produce --run {run_id}`"
            )
        return spec

    def find(self, run_id: str) -> RunSpec | None:
        return self.all().get(run_id)

    def register(self, spec: RunSpec) -> bool:
        """Write the spec; True if written, False if the identical spec exists."""
        existing = self.find(spec.run_id)
        if existing is not None:
            if existing == spec:
                return False
            changes = spec_differences(existing, spec)
            raise RunConflict(
                f"run {spec.run_id!r} already exists with different settings "
                f"({'; '.join(changes)}); a run spec never changes: use a new run id"
            )
        producer = clients.producer(self._settings)
        errors: list[str] = []

        def on_delivery(err: object, _msg: object) -> None:
            if err is not None:
                errors.append(str(err))

        producer.produce(
            topics.RUNS_TOPIC, key=spec.run_id.encode(), value=msgspec.json.encode(spec),
            on_delivery=on_delivery,
        )
        remaining = producer.flush(self._settings.connect_timeout_s)
        if remaining or errors:
            raise RuntimeError(f"could not write run {spec.run_id!r}: {errors or 'timed out'}")
        log.info("run registered", run=spec.run_id, settings_hash=spec.settings_hash)
        return True

    def create_run(self, spec: RunSpec) -> bool:
        """Register the spec and create its topics. Idempotent."""
        written = self.register(spec)
        wanted = {
            topics.completions_topic(spec.run_id): spec.partitions,
            topics.dlq_topic(spec.run_id): spec.partitions,
        }
        if spec.prompts_topic is None:
            wanted[topics.prompts_topic(spec.run_id)] = spec.partitions
        if spec.multi_turn == "regenerate-turns":
            wanted[topics.turns_topic(spec.run_id)] = spec.partitions
        admin = clients.admin(self._settings)
        clients.ensure_topics(admin, wanted, topics.RUN_TOPIC_CONFIG)
        clients.ensure_topics(admin, {topics.progress_topic(spec.run_id): 1},
                                    topics.COMPACTED_TOPIC_CONFIG)
        return written


def source_prompts_topic(spec: RunSpec) -> str:
    return spec.prompts_topic or topics.prompts_topic(spec.run_id)
