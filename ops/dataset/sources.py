"""Where a lineage's facts come from: the registry, each run's committed
counters, its DLQ topic (prompt id and reason of every dead letter) and the
S3 location its sink writes to. The I/O shell around `ops/dataset/index.py`."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import msgspec

from ops.dataset.index import LineageIndex, RunFacts
from ops.dataset.lineage import LineageError, kind_of, lineage
from schemas import RunSpec
from schemas.dlq import HEADER_REASON
from sink.object_keys import normalize_prefix
from tokenmill.kafka import committed, topics
from tokenmill.progress import LOOK_SETTLE_S, RunProgress, read_run_progress
from tokenmill.registry import RunRegistry
from tokenmill.settings import Settings


class _Envelope(msgspec.Struct):
    """The parts of a `schemas.DeadLetter` a lineage needs."""

    id: str
    reason: str


_envelope = msgspec.json.Decoder(_Envelope)


@dataclass(frozen=True)
class Lineage:
    specs: list[RunSpec]  # root first
    facts: list[RunFacts]
    progress: list[RunProgress]

    @property
    def complete(self) -> bool:
        return all(f.complete for f in self.facts)


def load_lineage(settings: Settings, run_id: str, *, settle_s: float = LOOK_SETTLE_S,
                 specs: Mapping[str, RunSpec] | None = None) -> Lineage:
    """The lineage of `run_id` (from `specs`, else the registry read now),
    each run's counters read settling at most `settle_s`."""
    if specs is None:
        registry = RunRegistry(settings)
        specs = registry.all()
        registry.get(run_id, specs)  # UnknownRun, saying how to create one
    chain = lineage(specs, run_id)
    states = [read_run_progress(settings, spec.run_id, settle_s=settle_s) for spec in chain]
    return Lineage(chain, [facts_of(s, p) for s, p in zip(chain, states)], states)


def facts_of(spec: RunSpec, state: RunProgress) -> RunFacts:
    return RunFacts(
        run_id=spec.run_id, kind=kind_of(spec), reasons=frozenset(spec.origin.reasons),
        complete=state.sink_done,
        prompts=state.producer.total if state.producer else 0,
        accepted=sum(s.s3_records for s in state.sinks.values()))


def dead_letters(settings: Settings, run_id: str) -> Iterator[tuple[str, str]]:
    """(prompt id, reason) of each committed record of the run's DLQ."""
    for message in committed.read_topic(settings, topics.dlq_topic(run_id)):
        reason = committed.header(message, HEADER_REASON)
        key = message.key()
        if reason is None or not key:
            envelope = _envelope.decode(message.value() or b"{}")
            yield envelope.id, envelope.reason
        else:
            yield key.decode(), reason.decode()


def build_index(settings: Settings, found: Lineage) -> LineageIndex:
    index = LineageIndex(found.facts)
    for spec in found.specs:
        index.add_run(dead_letters(settings, spec.run_id))
    return index


def s3_location(settings: Settings, spec: RunSpec) -> tuple[str, str]:
    """(bucket, key prefix) of the run's S3 objects: the sink's rule, flags
    and environment over the run spec."""
    destination = spec.s3
    bucket = settings.s3_bucket or (destination.bucket if destination else None)
    if not bucket:
        raise LineageError(f"no S3 bucket for run {spec.run_id}: the run spec has none; pass "
                          "--s3-bucket (or TOKENMILL_S3_BUCKET)")
    prefix = settings.s3_prefix or (destination.prefix if destination else "")
    return bucket, f"{normalize_prefix(prefix)}{spec.run_id}/"  # see sink/object_keys.py
