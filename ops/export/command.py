"""`tokenmill export RUN --format F --out DIR|s3://bucket/prefix`: the lineage's
dataset as training files.

1. Follow the lineage and read its dead letters: that decides which run's
   accepted result each prompt takes (`ops/dataset/index.py`), and so how many
   samples there are and which shard each lands in. Every run must be
   finished, or the dataset would still move.
2. Stream each run's S3 objects (root first, key order), keep the lines whose
   prompt takes this run's result, convert them, and cut them into shards of
   `--shard-records` with deterministic names. A regenerate-turns lineage's
   lines are conversations, a row each (`ops/export/conversations.py`); the
   partial ones are left out unless `--include-partial`, and a shard covers
   `--shard-records` accepted conversations, left out ones included, so the
   plan still fixes every shard's name and stretch.
3. After each shard, record it (size, SHA-256, per-run statistics) in
   `_export_progress.json`; at the end write the dataset card `README.md`,
   the report's page and numbers (`report.html`, `report.json`: `tokenmill
   report` without the throughput history) and `manifest.json`, and drop the
   progress file.

The same lineage exported twice gives the same bytes. A killed export run
again checks the shards its progress file lists, skips their records without
converting them, and goes on from the next shard: nothing twice, nothing lost.
Memory holds the dead-letter index, a few S3 objects and one row group.

The worst moment for a crash, a shard in place but not yet recorded, is the
crash point `export.shard_written` (tokenmill/crashpoints.py).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

import click
from rich.console import Console

from ops.dataset.index import DatasetSummary, LineageIndex
from ops.dataset.lineage import LineageError, kind_of
from ops.dataset.sources import Lineage, build_index, load_lineage, s3_location
from ops.export import card, conversations, formats, manifest, source
from ops.export.destination import BadDestination, Destination, open_destination
from ops.export.manifest import Manifest, Part, Plan, Shard
from ops.export.shards import ShardWriter, open_shard
from sink.s3_writer import make_client
from sink.service import tune_gc
from tokenmill import crashpoints
from tokenmill.commandline import register_known_error, service_command
from tokenmill.flag_types import RUN_ID
from tokenmill.log import get_logger
from tokenmill.progress_bars import progress_bars
from tokenmill.settings import Settings

log = get_logger("tokenmill.export")

DEFAULT_SHARD_RECORDS = 100_000


class ExportRefused(ValueError):
    """The lineage cannot be exported as it is, or the destination holds
    another export."""


class ExportFailed(RuntimeError):
    """What S3 holds disagrees with the lineage's counts: no manifest is written."""


register_known_error(ExportRefused, ExportFailed, LineageError, BadDestination)


def conversation_lineage(found: Lineage) -> bool:
    """Are the lineage's results conversations (regenerate-turns runs)? All
    or none: a shard holds one kind of row."""
    kinds = {spec.multi_turn == "regenerate-turns" for spec in found.specs}
    if len(kinds) > 1:
        raise ExportRefused("the lineage mixes regenerate-turns runs with others: "
                            + ", ".join(f"{s.run_id} ({s.multi_turn})" for s in found.specs))
    return kinds.pop()


def plan_export(found: Lineage, summary: DatasetSummary, fmt: str, shard_records: int,
                include_partial: bool = False) -> Plan:
    """Everything the exported bytes depend on (pure)."""
    conversations = conversation_lineage(found)
    parts = tuple(
        Part(run=spec.run_id, kind=kind_of(spec), parent=spec.parent_run,
             reasons=spec.origin.reasons, settings_hash=spec.settings_hash,
             generation=spec.generation, records=tally.winners)
        for spec, tally in zip(found.specs, summary.runs))
    records = sum(p.records for p in parts)
    return Plan(format=fmt, root=found.specs[0].run_id, parts=parts, records=records,
                shard_records=shard_records, without_result=summary.prompts - records,
                conversations=conversations, include_partial=conversations and include_partial)


def sample_id(line: bytes) -> str:
    """The prompt id of an S3 line without decoding it: the sink writes `id`
    first, and a tokenmill id is 32 hex characters; anything else is decoded."""
    if line[39:40] == b'"' and line.startswith(b'{"id":"'):
        return line[7:39].decode()
    return formats.decode(line).id


@dataclass(frozen=True)
class ExportOutcome:
    manifest: Manifest
    written: int  # shards written by this invocation
    resumed_after: int  # shards found in place
    already_done: bool = False


def _refuse_incomplete(found: Lineage) -> None:
    busy = [f"{facts.run_id} ({state.persisted:,} of {state.published:,} persisted)"
            for facts, state in zip(found.facts, found.progress) if not facts.complete]
    if busy:
        raise ExportRefused(f"run(s) of the lineage still in progress: {', '.join(busy)}; the "
                            "dataset would still move. Export once every run is finished "
                            f"(`tokenmill dataset {found.specs[-1].run_id}` shows where it stands)")


def _resume_point(dest: Destination, plan: Plan) -> Manifest | None:
    """The export so far: the shards of its manifest (or progress file) that
    are in place, in order; None if it is complete already."""
    data = dest.read(manifest.MANIFEST) or dest.read(manifest.PROGRESS)
    if data is None:
        return Manifest(plan=plan)
    found = manifest.decode(data)
    if found.plan != plan:
        raise ExportRefused(f"{dest.where} holds another export ({found.plan.format} of "
                            f"{found.plan.root}, {found.plan.records:,} samples, "
                            f"{found.plan.shard_records:,} per shard); use another --out")
    kept: list[Shard] = []
    for shard in found.shards:
        if dest.size(shard.name) != shard.bytes:
            break
        kept.append(shard)
    if found.complete and len(kept) == len(found.shards):
        return None
    return Manifest(plan=plan, shards=kept)


def run_export(settings: Settings, run_id: str, fmt: str, out: str, *,
               shard_records: int = DEFAULT_SHARD_RECORDS, include_partial: bool = False,
               show_progress: bool | None = None, err: Console | None = None) -> ExportOutcome:
    err = err or Console(stderr=True)
    if fmt == "parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise ExportRefused("--format parquet needs pyarrow: pip install "
                                "'tokenmill[parquet]'") from None
    dest = open_destination(out, settings)
    try:
        found = load_lineage(settings, run_id)
        _refuse_incomplete(found)
        index = build_index(settings, found)
        summary = index.summary()
        if summary.anomalies:
            raise ExportRefused("the lineage's dead letters are inconsistent: " + "; ".join(
                f"{m} ({n:,})" for m, n in summary.anomalies.items()))
        plan = plan_export(found, summary, fmt, shard_records, include_partial)
        current = _resume_point(dest, plan)
        if current is None:
            return ExportOutcome(manifest.decode(dest.read(manifest.MANIFEST) or b""), 0,
                                 plan.shards, already_done=True)
        resumed = len(current.shards)
        if resumed:
            log.info("resuming export", shards=resumed, records=current.records_done)
        written = _stream(settings, found, index, current, dest, show_progress, err)
        current.complete = True
        dest.write(manifest.CARD, card.render(current).encode())
        _write_report(settings, run_id, found, index, dest)
        dest.write(manifest.MANIFEST, manifest.encode(current))
        dest.delete(manifest.PROGRESS)
        return ExportOutcome(current, written, resumed)
    finally:
        dest.close()


def _write_report(settings: Settings, run_id: str, found: Lineage, index: LineageIndex,
                  dest: Destination) -> None:
    """`tokenmill report`'s page and numbers beside the card (report.html,
    report.json), without the throughput history (see ops/report/build.py)."""
    from ops.report.build import build_figures, write_report  # it reads lines as we do

    write_report(dest.write, build_figures(settings, run_id, found, index, history=False))


def _stream(settings: Settings, found: Lineage, index: LineageIndex, current: Manifest,
            dest: Destination, show_progress: bool | None, err: Console) -> int:
    """Write the shards after those in `current`; the count written."""
    plan = current.plan
    client = make_client(endpoint_url=settings.s3_endpoint_url, region=settings.s3_region)
    clean = index.clean_winner()
    skip = current.results_done
    seq = 0  # position in the dataset's order
    emitted: Counter[str] = Counter()
    read_from: list[str] = []
    writer: ShardWriter | None = None
    written = 0
    started = time.monotonic()
    with progress_bars(err, show_progress) as bars:
        task = bars.add_task("exporting", total=max(plan.records, 1), completed=skip, records=0)
        for j, spec in enumerate(found.specs):
            bucket, prefix = s3_location(settings, spec)
            keys = source.object_keys(client, bucket, prefix, spec.run_id)
            decode = (conversations.decode if spec.multi_turn == "regenerate-turns"
                      else formats.decode)
            read_from.append(f"s3://{bucket}/{prefix} ({len(keys):,} objects)")
            for line in source.lines(client, bucket, keys):
                if index.winner(sample_id(line), clean) != j:
                    continue
                emitted[spec.run_id] += 1
                seq += 1
                if seq <= skip:
                    continue
                if writer is None:
                    name = plan.shard_name(len(current.shards))
                    writer = open_shard(dest.staging(name), plan.format, plan.conversations,
                                        plan.include_partial)
                writer.add(decode(line))
                if writer.results == plan.shard_records:
                    _seal(writer, current, dest)
                    writer = None
                    written += 1
                if not seq & 1023:
                    bars.update(task, completed=seq, records=seq - skip)
        if writer is not None:
            _seal(writer, current, dest)
            written += 1
        bars.update(task, completed=seq, records=seq - skip)
    expected = {part.run: part.records for part in plan.parts}
    if dict(emitted) != {run: n for run, n in expected.items() if n}:
        raise ExportFailed(
            f"S3 holds other accepted results than the lineage's dead letters imply "
            f"(found by run {dict(emitted)}, expected {expected}, read from "
            f"{', '.join(read_from)}); no manifest written. Is --s3-bucket/--s3-prefix (or "
            "TOKENMILL_S3_*) where the sinks wrote? Were objects deleted?")
    log.info("exported", records=seq - skip, shards=written,
             seconds=round(time.monotonic() - started, 2))
    return written


def _seal(writer: ShardWriter, current: Manifest, dest: Destination) -> None:
    name = current.plan.shard_name(len(current.shards))
    size, digest = writer.finish()
    dest.commit(name, writer.path)
    # Written, not yet recorded in the progress file: a resume rewrites it.
    crashpoints.reached("export.shard_written", len(current.shards) + 1)
    current.shards.append(Shard(name=name, records=writer.records, bytes=size, sha256=digest,
                                runs=dict(sorted(writer.runs.items())),
                                left_out=writer.left_out))
    dest.write(manifest.PROGRESS, manifest.encode(current))


@click.command("export")
@click.argument("run_id", type=RUN_ID)
@click.option("--format", "fmt", type=click.Choice(formats.FORMATS), required=True,
              help="openai (messages + reasoning_content), sharegpt (conversations), "
                   "specforge (SpecForge's JSONL, reasoning in <think>), parquet.")
@click.option("--out", required=True, help="A directory, or s3://bucket/prefix.")
@click.option("--shard-records", type=click.IntRange(min=1), default=DEFAULT_SHARD_RECORDS,
              show_default=True, help="Samples (or conversations) per shard file.")
@click.option("--include-partial", is_flag=True,
              help="regenerate-turns runs: export tool_unresolved and tool_limit "
                   "conversations up to their last complete turn (left out by default; "
                   "counted either way).")
@click.option("--progress/--no-progress", "show_progress", default=None,
              help="Progress bar on stderr [default: when stderr is a terminal].")
@service_command
def export(settings: Settings, run_id: str, fmt: str, out: str, shard_records: int,
           include_partial: bool, show_progress: bool | None) -> None:
    """Write the dataset of RUN_ID's lineage as training files.

    For every prompt of the lineage's root, the accepted result of the newest
    run that has one, each once. Shards have deterministic names and a
    manifest.json lists them with counts and SHA-256 checksums; README.md is
    the dataset card. Exporting again gives identical bytes; a killed export
    run again resumes after its last finished shard.

    A regenerate-turns lineage exports one row per conversation, every
    assistant turn the model's own with its reasoning and tool calls, tool
    results in the format's tool role. Conversations that ended on an
    unanswered tool call or the tool-round limit are left out unless
    --include-partial, which keeps them up to their last complete turn.

    \b
    Examples:
      tokenmill export r1-16k --format specforge --out data/r1/
      tokenmill export r1 --format parquet --out s3://my-data/exports/r1/
      tokenmill export chats --format openai --out data/chats/ --include-partial
    """
    tune_gc()
    outcome = run_export(settings, run_id, fmt, out, shard_records=shard_records,
                         include_partial=include_partial, show_progress=show_progress)
    plan = outcome.manifest.plan
    where = out.rstrip("/")
    if outcome.already_done:
        click.echo(f"already exported: {plan.records:,} samples of {plan.root}'s lineage in "
                   f"{plan.shards} shard(s) at {where} (manifest.json); nothing written")
        return
    resumed = (f", resumed after {outcome.resumed_after} shard(s) already in place"
               if outcome.resumed_after else "")
    click.echo(f"exported {what_was_exported(outcome.manifest)} of "
               f"{' → '.join(p.run for p in plan.parts)} as {fmt}: {plan.shards} shard(s) at "
               f"{where}{resumed}; manifest.json, README.md ({plan.without_result:,} prompts "
               "without an accepted result)")


def what_was_exported(done: Manifest) -> str:
    """"1,200 samples", or for conversations their rows and the partial ones."""
    plan = done.plan
    if not plan.conversations:
        return f"{plan.records:,} samples"
    totals = done.totals().values()
    rows = sum(t.records for t in totals)
    cut = sum(t.partial for t in totals)
    left_out = sum(t.left_out for t in totals)
    return (f"{rows:,} conversations ({sum(t.turns for t in totals):,} generated turns; "
            f"partial: {cut:,} up to their last complete turn, {left_out:,} left out)")
