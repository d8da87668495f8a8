"""Redrive runs: a finished run's dead letters with chosen reasons (say the
254 of 1,503 cut at `max_tokens` 4096), generated again with other settings,
as a run of its own.

The child's prompts are exactly the parent's dead-letter records with those
reasons, read `read_committed`, deduplicated by prompt id, and published to
the child's own prompts topic with the producer's machinery: the DLQ is read
into the producer's spool (bucket = source x category, so the child's
partitions interleave the mix like any run), and the producer's transactional
`Publisher` publishes it, each transaction with its checkpoint. Reading the
DLQ partition by partition in offset order gives the same spool every time,
so a killed redrive run again resumes after its last committed transaction
and publishes each prompt once; run after it finished, it publishes nothing.

The parent must be finished (every published prompt persisted): only then is
its DLQ final. Redrives chain: a redrive's own dead letters can be redriven.
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console

from ops.resume import resumed_prompt
from producer.errors import ProducerError
from producer.ids import SeenIds
from producer.pipeline import prepare, run_lock, state_dir
from producer.publisher import Publisher, PublishPlan
from producer.records import prefix
from producer.spool import ID_BYTES, SpoolWriter
from schemas import CompletionRecord, Origin, PromptRecord, RunSpec
from schemas.dlq import HEADER_REASON
from schemas.prompt import Resume
from schemas.run import DLQ_REASONS
from tokenmill.kafka import committed, topics
from tokenmill.log import get_logger
from tokenmill.progress import read_run_progress
from tokenmill.progress_bars import progress_bars
from tokenmill.registry import RunRegistry
from tokenmill.settings import Settings

log = get_logger("tokenmill.redrive")


class RedriveRefused(ValueError):
    """The parent cannot be redriven (unfinished, or nothing to redrive)."""


def redrive_spec(parent: RunSpec, run_id: str, generation: dict[str, Any],
                 reasons: tuple[str, ...]) -> RunSpec:
    """The child spec (pure): the parent's policies and destination, new
    settings, its own prompts topic, and why it exists."""
    return RunSpec(
        run_id=run_id, partitions=parent.partitions,
        generation=msgspec.structs.replace(parent.generation, **generation),
        multi_turn=parent.multi_turn, qa=parent.qa, s3=parent.s3, parent_run=parent.run_id,
        estimate=parent.estimate, origin=Origin(kind="redrive", reasons=reasons),
        gpus=parent.gpus, tool_results=parent.tool_results)


def parse_reasons(value: str) -> tuple[str, ...]:
    reasons = tuple(sorted({r.strip() for r in value.split(",") if r.strip()}))
    unknown = set(reasons) - DLQ_REASONS
    if not reasons or unknown:
        raise ValueError(f"--reasons: unknown DLQ reason(s) {sorted(unknown)}; choose from "
                         f"{','.join(sorted(DLQ_REASONS))}" if unknown else
                         "--reasons: name at least one DLQ reason")
    return reasons


class _Prompted(msgspec.Struct):
    prompt: PromptRecord


class _Letter(msgspec.Struct):
    """The parts of a `schemas.DeadLetter` a redrive needs."""

    id: str
    reason: str
    record: _Prompted


class _WholeLetter(msgspec.Struct):
    """A dead letter with its whole record: a conversation's steps."""

    id: str
    reason: str
    record: CompletionRecord


_letter = msgspec.json.Decoder(_Letter)
_whole_letter = msgspec.json.Decoder(_WholeLetter)


@dataclass
class Spooled:
    """The redrive's prompts in the spool, counted like the producer's pass 1."""

    bucket_counts: list[int] = field(default_factory=list)
    by_category: Counter[str] = field(default_factory=Counter)
    by_source: Counter[str] = field(default_factory=Counter)
    by_reason: Counter[str] = field(default_factory=Counter)
    duplicates: int = 0
    resumed: int = 0  # conversations resumed at their failed step (--from-failed-turn)

    @property
    def total(self) -> int:
        return sum(self.bucket_counts)


def spool_dead_letters(letters: Any, reasons: tuple[str, ...], run_id: str,
                       spool: SpoolWriter, resume_from: RunSpec | None = None) -> Spooled:
    """Write each (reason header, DLQ value) with a chosen reason to the spool
    as a prompt of `run_id`, first occurrence of each id only. Buckets are
    numbered in order of first appearance, so the same letters in the same
    order give the same spool. `resume_from` (the parent's spec, for
    `--from-failed-turn`): each conversation resumes at its failed step."""
    out = Spooled()
    buckets: dict[tuple[str, str], int] = {}
    seen = SeenIds()
    wanted = set(reasons)
    for reason, value in letters:
        if reason is not None and reason not in wanted:
            continue
        letter: _Letter | _WholeLetter = (_letter if resume_from is None
                                          else _whole_letter).decode(value)
        if letter.reason not in wanted:
            continue
        prompt = letter.record.prompt
        if isinstance(letter, _WholeLetter):
            assert resume_from is not None
            prompt = resumed_prompt(letter.record, resume_from)
            if isinstance(prompt.resume, Resume):
                out.resumed += 1
        try:
            key = int(prompt.id, 16) if len(prompt.id) == ID_BYTES else -1
        except ValueError:
            key = -1
        if key < 0:
            raise ProducerError(f"dead letter for prompt {prompt.id!r}: not a tokenmill prompt "
                                f"id ({ID_BYTES} hex characters); cannot redrive it")
        if key in seen:
            out.duplicates += 1
            continue
        seen.add(key)
        bucket = buckets.setdefault((prompt.source, prompt.category), len(buckets))
        if bucket == len(out.bucket_counts):
            out.bucket_counts.append(0)
        out.bucket_counts[bucket] += 1
        spool.add(bucket, prompt.id.encode(),
                  prefix(msgspec.structs.replace(prompt, run=run_id, seq=0, v=1)))
        out.by_category[prompt.category] += 1
        out.by_source[prompt.source] += 1
        out.by_reason[letter.reason] += 1
    return out


def _letters(settings: Settings, parent_id: str) -> Any:
    """(reason header or None, value) of each committed dead letter, partition
    by partition in offset order."""
    for message in committed.read_topic(settings, topics.dlq_topic(parent_id)):
        reason = committed.header(message, HEADER_REASON)
        yield (reason.decode() if reason is not None else None), message.value() or b""


@dataclass(frozen=True)
class RedriveOutcome:
    spec: RunSpec
    total: int  # prompts the redrive holds in all
    published: int  # by this invocation
    already_done: bool = False
    spooled: Spooled | None = None


def run_redrive(settings: Settings, parent_id: str, run_id: str, generation: dict[str, Any],
                reasons: tuple[str, ...], *, from_failed_turn: bool = False,
                transaction_records: int = 20_000,
                show_progress: bool | None = None, out: Console | None = None,
                err: Console | None = None) -> RedriveOutcome:
    out = out or Console()
    err = err or Console(stderr=True)
    registry = RunRegistry(settings)
    parent = registry.get(parent_id)
    if from_failed_turn and parent.multi_turn != "regenerate-turns":
        raise RedriveRefused(f"--from-failed-turn resumes conversations: run {parent_id!r} "
                             f"is a {parent.multi_turn} run, not regenerate-turns")
    spec = redrive_spec(parent, run_id, generation, reasons)
    parent_state = read_run_progress(settings, parent_id)
    if not parent_state.sink_done:
        raise RedriveRefused(
            f"run {parent_id!r} is not finished ({parent_state.persisted:,} of "
            f"{parent_state.published:,} published prompts persisted"
            f"{'' if parent_state.publishing_done else ', still publishing'}): its "
            "dead-letter topic is not final yet; redrive it once its sink is done")
    directory = state_dir(settings, run_id)
    with run_lock(directory):
        publisher = Publisher(settings, run_id)
        try:
            done = prepare(registry, publisher, spec)
            if done is not None:
                out.print(f"run {run_id} is already fully published: {done:,} prompts in "
                          f"{topics.prompts_topic(run_id)}; nothing to publish (0 published)")
                return RedriveOutcome(spec, done, 0, already_done=True)
            started = time.monotonic()
            spool = SpoolWriter(directory / "spool")
            try:
                spooled = spool_dead_letters(_letters(settings, parent_id), reasons, run_id,
                                             spool, parent if from_failed_turn else None)
            finally:
                spool.close()
            log.info("dead letters read", parent=parent_id, prompts=spooled.total,
                     duplicates=spooled.duplicates, seconds=round(time.monotonic() - started, 2))
            if spooled.total == 0:
                raise RedriveRefused(f"run {parent_id!r} has no dead letters with reason(s) "
                                     f"{','.join(reasons)}: nothing to redrive")
            registry.create_run(spec)
            published = _publish(publisher, spec, spooled, directory / "spool",
                                 transaction_records, show_progress, out, err)
            return RedriveOutcome(spec, spooled.total, published, spooled=spooled)
        finally:
            publisher.close()
            shutil.rmtree(directory / "spool", ignore_errors=True)


def _publish(publisher: Publisher, spec: RunSpec, spooled: Spooled, spool_dir: Path,
             transaction_records: int, show_progress: bool | None, out: Console,
             err: Console) -> int:
    topic = topics.prompts_topic(spec.run_id)
    plan = PublishPlan(run=spec.run_id, topic=topic, partitions=spec.partitions,
                       bucket_counts=spooled.bucket_counts, spool_dir=spool_dir,
                       max_records=transaction_records,
                       by_category=dict(sorted(spooled.by_category.items())),
                       by_source=dict(sorted(spooled.by_source.items())),
                       duplicates=spooled.duplicates)
    resume = publisher.resume_point(plan)
    if resume.next_seq:
        out.print(f"resuming run {spec.run_id}: {resume.next_seq:,} of {plan.total:,} prompts "
                  "already committed")
    started = time.monotonic()
    with progress_bars(err, show_progress) as bars:
        first = resume.next_seq
        task = bars.add_task("publishing", total=plan.total, completed=first, records=0)

        def update(seq: int) -> None:
            bars.update(task, completed=seq, records=seq - first)

        published = publisher.publish(plan, resume, update)
    out.print(f"published {published:,} prompts to {topic} in "
              f"{time.monotonic() - started:.1f}s; {plan.total:,} in all")
    return published
