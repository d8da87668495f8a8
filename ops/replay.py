"""Replay runs: the same published prompts, generated again with other
settings (say 8192 max tokens after 18% were cut at 4096), as a run of its own.

The replay reads its parent's prompts topic with a consumer group of its own
and writes its own completions, DLQ and S3 objects, so outputs of the two
settings can never mix. The parent must be fully published; the replay's
producer checkpoint is the parent's, so progress and `--until-done` work.
"""

from __future__ import annotations

from typing import Any

import msgspec

from schemas import Origin, RunSpec
from schemas.progress import ProducerCheckpoint, producer_key
from tokenmill import progress
from tokenmill.kafka import clients, topics
from tokenmill.registry import RunRegistry, source_prompts_topic
from tokenmill.settings import Settings


class ReplayRefused(ValueError):
    """The parent cannot be replayed (unknown, or not fully published)."""


def replay_spec(parent: RunSpec, run_id: str, generation: dict[str, Any],
                overrides: dict[str, Any]) -> RunSpec:
    """The child spec (pure): the parent's prompts and policies, new settings."""
    new_generation = msgspec.structs.replace(parent.generation, **generation)
    fields: dict[str, Any] = {
        "run_id": run_id,
        "partitions": parent.partitions,
        "generation": new_generation,
        "multi_turn": parent.multi_turn,
        "tool_results": parent.tool_results,
        "qa": parent.qa,
        "s3": parent.s3,
        "parent_run": parent.run_id,
        "estimate": parent.estimate,
        "inputs": parent.inputs,
        "prompts_topic": source_prompts_topic(parent),
        "origin": Origin(kind="replay"),
        "gpus": parent.gpus,
    }
    fields.update({k: v for k, v in overrides.items() if v is not None})
    return RunSpec(**fields)


def create_replay(settings: Settings, parent_id: str, run_id: str, generation: dict[str, Any],
                  overrides: dict[str, Any]) -> tuple[RunSpec, bool]:
    registry = RunRegistry(settings)
    parent = registry.get(parent_id)
    checkpoint = progress.read_producer_checkpoint(settings, parent_id)
    if checkpoint is None or not checkpoint.done:
        raise ReplayRefused(
            f"run {parent_id!r} is not fully published yet "
            f"({checkpoint.next_seq if checkpoint else 0:,} prompts so far); "
            "replay it once its producer has finished")
    spec = replay_spec(parent, run_id, generation, overrides)
    created = registry.create_run(spec)
    mine = progress.read_producer_checkpoint(settings, run_id)
    if mine is None:
        inherited = msgspec.structs.replace(checkpoint, run=run_id)
        producer = clients.producer(settings)
        producer.produce(topics.progress_topic(run_id), key=producer_key(run_id).encode(),
                         value=msgspec.json.encode(inherited))
        if producer.flush(settings.connect_timeout_s):
            raise RuntimeError(f"could not write the checkpoint of replay {run_id!r}")
    return spec, created


__all__ = ["ProducerCheckpoint", "ReplayRefused", "create_replay", "replay_spec"]
