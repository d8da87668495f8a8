"""`tokenmill status --run RUN`: one command for every question the seed
run's operator kept asking - where are we vs the estimate, is speculative
decoding on (accept length), what concurrency runs per GPU, are we writing
to S3, are we using the whole dataset, are tool and multi-turn prompts being
generated, how many answers are truncated or empty, did we lose anything.

Everything comes from committed state (the run spec and the exact counters
in `tokenmill.<run>.progress`), so the numbers are the ones that will land.
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import click
import msgspec
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from consumer.fleet import worker_of
from ops.dataset.coverage import coverage_line, lineage_coverage
from ops.health import Health, Thresholds, assess, is_live, live_rates
from ops.status_report import to_report
from schemas import RunSpec
from tokenmill.commandline import service_command
from tokenmill.flag_types import RUN_ID, seconds
from tokenmill.kafka import clients, groups, topics
from tokenmill.kafka.groups import GroupState
from tokenmill.progress import GLANCE_SETTLE_S, RunProgress, read_run_progress
from tokenmill.registry import RunRegistry, source_prompts_topic
from tokenmill.settings import Settings

STATUS_SCHEMA_PATH = Path(__file__).with_name("status.schema.json")


def summarize(spec: RunSpec, state: RunProgress, now: float | None = None,
              thresholds: Thresholds = Thresholds(),
              unowned: dict[int, float] | None = None) -> dict[str, Any]:
    """The numbers behind the report (pure: easy to test, and `--json`,
    whose schema is ops/status.schema.json)."""
    now = time.time() if now is None else now
    health = assess(state, now, thresholds, unowned)
    member = {(m.kind, m.instance): m for m in health.members}
    recent_rps, recent_tps, window = live_rates(state, health)
    consumers = list(state.consumers.values())
    starts = [c.started_at for c in consumers if c.started_at]
    last = max((c.updated_at for c in consumers), default=0.0)
    elapsed = (last - min(starts)) if starts and last else 0.0
    generated = state.generated
    completions = int(state.consumer_total("completions"))
    completion_tokens = int(state.consumer_total("completion_tokens"))
    req_rate = generated / elapsed if elapsed > 0 else 0.0
    tok_rate = completion_tokens / elapsed if elapsed > 0 else 0.0
    total = state.producer.total if state.producer else 0
    remaining = max(0, total - generated)
    spec_tokens = int(state.consumer_total("spec_tokens"))
    accept = (state.consumer_total("spec_accept_weighted") / spec_tokens) if spec_tokens else None
    finish = state.consumer_counter("finish_reasons")
    estimate = spec.estimate
    est_rps = estimate.requests_per_s if estimate else None
    est_tokens = estimate.output_tokens if estimate else None
    completions_done = sum(finish.values())
    per_instance = []
    for c in sorted(consumers, key=lambda c: c.instance):
        span = c.updated_at - c.started_at if c.started_at else 0.0
        accept_i = c.spec_accept_weighted / c.spec_tokens if c.spec_tokens else None
        health_i = member[("worker", c.instance)]
        live = is_live(health_i.state)
        per_instance.append({
            "instance": c.instance, "state": health_i.state,
            "completions": c.completions, "failures": c.failures,
            "tokens_per_s": c.completion_tokens / span if span > 0 else 0.0,
            "recent_tokens_per_s": c.recent_tokens_per_s if live else 0.0,
            "recent_requests_per_s": c.recent_requests_per_s if live else 0.0,
            "accept_length": accept_i, "concurrency_limit": c.concurrency_limit,
            "in_flight": c.in_flight if live else 0, "last_commit_age_s": now - c.updated_at,
            "last_result_age_s": health_i.last_work_age_s, "partitions": c.partitions,
            "breaker": c.breaker, "server": c.server, "headroom": health_i.headroom,
        })
    sinks = []
    for k in sorted(state.sinks.values(), key=lambda k: k.instance):
        health_k = member[("sink", k.instance)]
        sinks.append({
            "instance": k.instance, "state": health_k.state,
            "last_commit_age_s": now - k.updated_at, "last_upload_age_s": health_k.last_work_age_s,
            "s3_objects": k.s3_objects, "s3_bytes": k.s3_bytes, "s3_records": k.s3_records,
            "dlq_records": k.dlq_records, "partitions": k.partitions,
            "waiting_records": k.waiting_records if is_live(health_k.state) else 0,
            "uploading_for_s": (now - k.uploading_since) if k.uploading_since
            and is_live(health_k.state) else None,
            "upload_errors": k.upload_errors, "last_error": k.last_error,
            "last_error_age_s": (now - k.last_error_at) if k.last_error_at else None,
        })
    producer = state.producer
    return {
        "run": spec.run_id,
        "settings_hash": spec.settings_hash,
        "published": state.published,
        "total": total,
        "publishing_done": state.publishing_done,
        "generated": generated,
        "completions": completions,
        "completion_tokens": completion_tokens,
        "failures": int(state.consumer_total("failures")),
        "failures_by_kind": dict(state.consumer_counter("failures_by_kind")),
        "persisted": state.persisted,
        "s3_records": sum(s.s3_records for s in state.sinks.values()),
        "s3_objects": sum(s.s3_objects for s in state.sinks.values()),
        "s3_bytes": sum(s.s3_bytes for s in state.sinks.values()),
        "last_object": max((s.last_object for s in state.sinks.values()), default=""),
        "dlq_records": sum(s.dlq_records for s in state.sinks.values()),
        "dlq_by_reason": dict(state.sink_counter("dlq_by_reason")),
        "elapsed_s": elapsed,
        "requests_per_s": req_rate,
        "tokens_per_s": tok_rate,
        "eta_s": remaining / req_rate if req_rate > 0 else None,
        "recent_requests_per_s": recent_rps,
        "recent_tokens_per_s": recent_tps,
        "recent_window_s": window,
        "recent_eta_s": (remaining / recent_rps if recent_rps > 0 else None) if remaining else 0.0,
        "in_flight": sum(w["in_flight"] for w in per_instance),
        "estimate_requests_per_s": est_rps,
        "estimate_output_tokens": est_tokens,
        "estimate_truncated_share": estimate.truncated_share if estimate else None,
        "estimate_tokens_per_s": estimate.tokens_per_s if estimate else None,
        "estimate_hours": estimate.hours if estimate else None,
        "estimate_concurrency": estimate.concurrency if estimate else None,
        "estimate_source": estimate.source if estimate else None,
        "truncated_share": finish.get("length", 0) / completions_done if completions_done else None,
        "mean_output_tokens": completion_tokens / completions if completions else None,
        "reasoning_share": (state.consumer_total("reasoning_tokens") / completion_tokens
                            if completion_tokens else None),
        "accept_length": accept,
        "finish_reasons": dict(finish),
        "generated_by_category": dict(state.consumer_counter("by_category")),
        "planned_by_category": dict(producer.by_category) if producer else {},
        "planned_by_source": dict(producer.by_source) if producer else {},
        "rejected": producer.rejected if producer else 0,
        "duplicates": producer.duplicates if producer else 0,
        "instances": per_instance,
        "sinks": sinks,
        "generation_done": state.generation_done,
        "sink_done": state.sink_done,
        "health": health,
        "conversations": conversation_counts(state) if spec.multi_turn == "regenerate-turns"
        else None,
    }


def conversation_counts(state: RunProgress) -> dict[str, int]:
    finished = int(state.consumer_total("completions"))
    failed = int(state.consumer_total("failures"))
    in_progress = int(state.consumer_total("turns_pending"))
    return {"turns": int(state.consumer_total("turns")), "finished": finished, "failed": failed,
            "in_progress": in_progress,
            "not_started": max(0, state.published - finished - failed - in_progress)}


def group_summary(state: GroupState, partitions: int,
                  unowned_since: dict[int, float] | None = None,
                  now: float | None = None) -> dict[str, Any]:
    """Who owns the run's partitions, from the generate group as the broker
    sees it: per worker its group members (slots), partitions and share of
    the run, and the partitions no member owns (with for how long, when an
    earlier look saw them unowned already). Pure."""
    now = time.monotonic() if now is None else now
    workers: dict[str, dict[str, Any]] = {}
    for member in state.members:
        row = workers.setdefault(worker_of(member.client_id),
                                 {"slots": 0, "standbys": 0, "partitions": []})
        row["slots"] += 1
        row["standbys"] += 0 if member.partitions else 1
        row["partitions"].extend(member.partitions)
    for row in workers.values():
        row["partitions"] = sorted(row["partitions"])
        row["share"] = round(len(row["partitions"]) / partitions, 3) if partitions else 0.0
    unowned = sorted(state.unowned(partitions))
    since = unowned_since if unowned_since is not None else {}
    for p in list(since):
        if p not in unowned:
            del since[p]
    for p in unowned:
        since.setdefault(p, now)
    return {"stable": state.stable, "workers": dict(sorted(workers.items())),
            "unowned": {str(p): round(now - since[p], 1) for p in unowned}}


def read_group(settings: Settings, spec: RunSpec, admin: AdminClient) -> GroupState | None:
    try:
        return groups.describe(admin, topics.generate_group(spec.run_id),
                               source_prompts_topic(spec), settings.connect_timeout_s)
    except KafkaException:
        return None


def show(spec: RunSpec, summary: dict[str, Any], group: dict[str, Any] | None,
         coverage: dict[str, Any] | None, clear: bool) -> None:
    """The report on the terminal (rich is imported here, not for --json)."""
    from rich.console import Console

    from ops import status_view

    console = Console()
    if clear and console.is_terminal:
        console.clear()  # a live view, not a scrolling log
    console.print(status_view.render(spec, summary))
    if group is not None and group["workers"]:
        console.print(status_view.render_group(group))
    if coverage is not None:
        console.print(coverage_line(coverage))


def check_lines(run_id: str, summary: dict[str, Any]) -> list[str]:
    """`status --check`: one line per problem, or one OK line."""
    health: Health = summary["health"]
    if not health.problems:
        return [f"OK: run {run_id} {health.state}: {summary['persisted']:,} of "
                f"{summary['total']:,} persisted"]
    return [f"{problem.line()} (run {run_id})" for problem in health.problems]


def share(low: float = 0.0, high: float = 1.0) -> click.FloatRange:
    return click.FloatRange(low, high)


@click.command()
@click.option("--run", "run_id", required=True, type=RUN_ID, help="Run id.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the numbers as JSON (schema: `tokenmill status --json-schema`).")
@click.option("--json-schema", is_flag=True, help="Print the JSON schema of --json and exit.")
@click.option("--check", is_flag=True,
              help="Print one line per problem and exit 0 (healthy), 1 (warning) or "
                   "2 (critical): for systemd timers, cron and monitoring.")
@click.option("--watch", type=seconds(0, 86400, min_open=False), default=0.0,
              help="Refresh every N seconds (0: once).")
@click.option("--stall-after", "stall_after_s", type=seconds(1, 7 * 86400), default=600.0,
              show_default=True,
              help="Seconds without a committed result or upload before a run with work "
                   "left is stalled.")
@click.option("--upload-stall", "upload_stall_s", type=seconds(1, 86400), default=120.0,
              show_default=True, help="Seconds an S3 upload may be in flight before it is a "
                                      "warning.")
@click.option("--max-failure-share", type=share(), default=0.05, show_default=True,
              help="Failed share of generated records above which the run is critical.")
@click.option("--max-truncated-share", type=share(), default=0.25, show_default=True,
              help="Share of answers cut at max_tokens above which the run warns.")
@click.option("--max-dlq-share", type=share(), default=0.30, show_default=True,
              help="Share of persisted records in the dead-letter topic above which the "
                   "run warns.")
@service_command
def status(settings: Settings, run_id: str, as_json: bool, json_schema: bool, check: bool,
           watch: float, stall_after_s: float, upload_stall_s: float, max_failure_share: float,
           max_truncated_share: float, max_dlq_share: float) -> None:
    """Where a run stands: progress vs estimate, speed per GPU (recent and
    average), accept length, truncation and failures, coverage by category,
    S3 and DLQ, the state of every worker and sink, and what is wrong.

    \b
    Example:
      tokenmill status --run my-run
      tokenmill status --run my-run --watch 30
      tokenmill status --run my-run --check --stall-after 900   # exit 0 / 1 / 2
    """
    if json_schema:
        click.echo(STATUS_SCHEMA_PATH.read_text(), nl=False)
        return
    thresholds = Thresholds(stall_after_s=stall_after_s, upload_stall_s=upload_stall_s,
                            max_failure_share=max_failure_share,
                            max_truncated_share=max_truncated_share, max_dlq_share=max_dlq_share)
    unowned_since: dict[int, float] = {}
    # The group and the counters are read side by side, through one admin
    # client: each read is a few round trips to the brokers, each new client
    # a connection and a metadata round trip more, and a fleet starting on
    # the same machine makes every one of them wait for a CPU (the seed run:
    # 4.3 s at its launch). The registry is read first: a run it does not
    # know has no counters to read, and a read started beside it must be
    # waited for when it fails: with the counters' read in a daemon thread
    # beside the registry's, one CI run saw `status` end in SIGSEGV when the
    # broker refused our CA (the process exiting while that thread was still
    # inside librdkafka; not reproduced in 7 tries since). A pool's thread is
    # waited for at exit.
    looks = ThreadPoolExecutor(1, thread_name_prefix="status-group")
    registry = RunRegistry(settings)  # checks the broker at its first read only
    while True:
        admin = clients.admin(settings)
        specs = registry.all(admin)  # each look: a redrive or replay of the run may be registered
        spec = registry.get(run_id, specs)
        reading_group = looks.submit(read_group, settings, spec, admin)
        glance = read_run_progress(settings, run_id, settle_s=GLANCE_SETTLE_S, admin=admin)
        state = reading_group.result()
        group = (None if state is None else
                 group_summary(state, spec.partitions, unowned_since))
        unowned = ({int(p): age for p, age in group["unowned"].items()}
                   if group is not None else None)
        summary = summarize(spec, glance, thresholds=thresholds, unowned=unowned)
        summary["group"] = group
        if check:
            for line in check_lines(run_id, summary):
                click.echo(line)
            sys.exit(summary["health"].exit_code)
        summary["lineage"] = coverage = lineage_coverage(settings, run_id, specs)
        if as_json:
            click.echo(msgspec.json.encode(to_report(summary)).decode())
        else:
            show(spec, summary, group, coverage, clear=watch > 0)
        if watch <= 0:
            return
        time.sleep(watch)
