"""The producer's run, start to end, as one function the CLI and tests call:

  1. check the inputs (a missing file fails before anything is written),
  2. fingerprint them and refuse a run id already used with other settings,
  3. fence any earlier producer of the run; stop if it already finished,
  4. pass 1: read, normalize, dedupe, spool by bucket (summary, rejects file),
  5. create the run (spec + topics), and
  6. pass 2: publish in the mixed, balanced order, in transactions, resuming
     after the last committed one.
"""

from __future__ import annotations

import contextlib
import fcntl
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from producer.errors import AlreadyRunning, NothingToPublish
from producer.ingest import IngestOptions, IngestResult, bucket_label, ingest
from producer.inputs import Source, fingerprint, resolve
from producer.mixing import partition_sizes
from producer.publisher import Publisher, PublishPlan
from producer.rejects import RejectsFile
from producer.spool import SpoolWriter
from producer.summary import Summary, print_summary
from schemas.run import RunSpec
from tokenmill.kafka import topics
from tokenmill.log import get_logger
from tokenmill.progress_bars import progress_bars
from tokenmill.registry import RunRegistry
from tokenmill.settings import Settings

log = get_logger("tokenmill.producer")


@dataclass(frozen=True)
class ProduceOptions:
    files: tuple[Path, ...]
    spec: RunSpec  # inputs are filled in from the files
    rejects_path: Path | None = None
    strict: bool = False
    dry_run: bool = False
    transaction_records: int = 20_000
    show_progress: bool | None = None  # None: when stderr is a terminal


@dataclass(frozen=True)
class Outcome:
    spec: RunSpec
    total: int  # prompts the run holds in all
    published: int  # prompts published by this invocation
    already_done: bool = False
    summary: Summary | None = None  # None when stopped before reading
    rejects_path: Path | None = None


def state_dir(settings: Settings, run_id: str) -> Path:
    return settings.state_dir / "producer" / run_id


@contextlib.contextmanager
def run_lock(directory: Path) -> Iterator[None]:
    """One producer per run per machine: the spool belongs to one process.
    (Across machines, the transactional id fences the older producer.)"""
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / "lock").open("w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise AlreadyRunning(f"another `tokenmill produce` is running for this run "
                                 f"(lock {directory / 'lock'})") from None
        yield


def run_producer(settings: Settings, options: ProduceOptions, out: Console | None = None,
                 err: Console | None = None) -> Outcome:
    out = out or Console()
    err = err or Console(stderr=True)
    sources = resolve(list(options.files))
    run_id = options.spec.run_id
    directory = state_dir(settings, run_id)
    with run_lock(directory):
        started = time.monotonic()
        spec = _with_inputs(options.spec, sources)
        log.info("inputs fingerprinted", files=len(sources),
                 bytes=sum(f.size for f in spec.inputs),
                 seconds=round(time.monotonic() - started, 2))
        registry = RunRegistry(settings)
        publisher: Publisher | None = None
        try:
            if not options.dry_run:
                started = time.monotonic()
                publisher = Publisher(settings, run_id)
                done = prepare(registry, publisher, spec)
                log.info("producer fenced", run=run_id,
                         seconds=round(time.monotonic() - started, 2))
                if done is not None:
                    out.print(f"run {run_id} is already fully published: {done:,} prompts in "
                              f"{topics.prompts_topic(run_id)}; nothing to publish (0 published)")
                    return Outcome(spec, done, 0, already_done=True)
            rejects = RejectsFile(options.rejects_path or directory / "rejects.jsonl")
            result = _pass_one(sources, spec, options, directory, rejects, err)
            print_summary(out, result.summary, str(rejects.path))
            if result.total == 0:
                raise NothingToPublish(
                    f"no prompt accepted from {len(sources)} input file(s) "
                    f"({result.summary.rejected:,} rejected, {result.summary.duplicates:,} "
                    f"duplicates); see {rejects.path}")
            _print_plan(out, sources, result, spec.partitions)
            if options.dry_run:
                out.print(f"dry run: {result.total:,} prompts would be published to "
                          f"{topics.prompts_topic(run_id)}; nothing was created or published")
                return Outcome(spec, result.total, 0, summary=result.summary,
                               rejects_path=rejects.path if rejects.count else None)
            assert publisher is not None
            started = time.monotonic()
            registry.create_run(spec)
            log.info("run created", run=run_id, partitions=spec.partitions,
                     seconds=round(time.monotonic() - started, 2))
            published, done = _pass_two(publisher, spec, result, directory, options, out, err)
            return Outcome(spec, result.total, published, already_done=done,
                           summary=result.summary,
                           rejects_path=rejects.path if rejects.count else None)
        finally:
            if publisher is not None:
                publisher.close()
            # The spool is a cache of pass 1, rebuilt by every run (a kill -9
            # leaves it for the next run to overwrite).
            shutil.rmtree(directory / "spool", ignore_errors=True)


def _with_inputs(spec: RunSpec, sources: list[Source]) -> RunSpec:
    import msgspec

    return msgspec.structs.replace(spec, inputs=tuple(fingerprint(s) for s in sources))


def prepare(registry: RunRegistry, publisher: Publisher, spec: RunSpec) -> int | None:
    """Refuse a conflicting spec, fence the run's earlier producer; the total
    if the run is already fully published, else None."""
    existing = registry.find(spec.run_id)
    if existing is not None and existing != spec:
        registry.register(spec)  # raises RunConflict naming the differences
    publisher.fence()
    if existing is not None:
        checkpoint = publisher.checkpoint()
        if checkpoint is not None and checkpoint.done:
            return checkpoint.total
    return None


def _pass_one(sources: list[Source], spec: RunSpec, options: ProduceOptions, directory: Path,
              rejects: RejectsFile, err: Console) -> IngestResult:
    ingest_options = IngestOptions(run=spec.run_id, policy=spec.multi_turn,
                                   tool_mode=spec.generation.tools, strict=options.strict)
    spool = SpoolWriter(directory / "spool")
    total_bytes = sum(f.size for f in spec.inputs)
    started = time.monotonic()
    try:
        with progress_bars(err, options.show_progress) as bars:
            task = bars.add_task("reading", total=max(total_bytes, 1), records=0)

            def update(done: int, records: int) -> None:
                bars.update(task, completed=done, records=records)

            result = ingest(sources, ingest_options, spool, rejects, update)
    finally:
        spool.close()
        rejects.close()
    if rejects.count == 0:
        rejects.clear()
    log.info("inputs read", files=len(sources), records=result.summary.records,
             prompts=result.total, duplicates=result.summary.duplicates,
             rejected=result.summary.rejected, seconds=round(time.monotonic() - started, 2))
    return result


def _pass_two(publisher: Publisher, spec: RunSpec, result: IngestResult, directory: Path,
              options: ProduceOptions, out: Console, err: Console) -> tuple[int, bool]:
    """(published now, already done before)."""
    topic = topics.prompts_topic(spec.run_id)
    summary = result.summary
    by_category: dict[str, int] = {}
    for source in summary.sources:
        for category, n in source.by_category.items():
            by_category[category] = by_category.get(category, 0) + n
    plan = PublishPlan(run=spec.run_id, topic=topic, partitions=spec.partitions,
                       bucket_counts=result.bucket_counts, spool_dir=directory / "spool",
                       max_records=options.transaction_records,
                       by_category=dict(sorted(by_category.items())),
                       by_source={s.name: s.prompts for s in summary.sources},
                       rejected=summary.rejected, duplicates=summary.duplicates)
    started = time.monotonic()
    resume = publisher.resume_point(plan)
    log.info("resume point read", run=spec.run_id, next_seq=resume.next_seq,
             seconds=round(time.monotonic() - started, 2))
    if resume.next_seq >= plan.total:
        out.print(f"run {spec.run_id} is already fully published: {plan.total:,} prompts in "
                  f"{topic}; nothing to publish (0 published)")
        return 0, True
    if resume.next_seq:
        out.print(f"resuming run {spec.run_id}: {resume.next_seq:,} of {plan.total:,} prompts "
                  "already committed")
    started = time.monotonic()
    with progress_bars(err, options.show_progress) as bars:
        first = resume.next_seq
        task = bars.add_task("publishing", total=plan.total, completed=first, records=0)

        def update(seq: int) -> None:
            bars.update(task, completed=seq, records=seq - first)

        published = publisher.publish(plan, resume, update)
    seconds = time.monotonic() - started
    sizes = partition_sizes(plan.total, plan.partitions)
    out.print(f"published {published:,} prompts to {topic} in {seconds:.1f}s "
              f"({published / max(seconds, 1e-9):,.0f}/s); {plan.total:,} in all over "
              f"{plan.partitions} partitions ({min(sizes):,}-{max(sizes):,} each)")
    return published, False


def _print_plan(out: Console, sources: list[Source], result: IngestResult,
                partitions: int) -> None:
    sizes = partition_sizes(result.total, partitions)
    mixed = [bucket_label(sources, b) for b, n in enumerate(result.bucket_counts) if n]
    out.print(f"{partitions} partitions of {min(sizes):,}-{max(sizes):,} prompts, each "
              f"interleaving {len(mixed)} buckets: {', '.join(mixed)}")
