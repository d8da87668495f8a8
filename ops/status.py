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
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import click
import msgspec
from confluent_kafka import KafkaException
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from consumer.fleet import worker_of
from ops.dataset.coverage import coverage_line, lineage_coverage
from ops.health import Health, MemberState, Thresholds, assess, is_live, live_rates
from ops.status_report import to_report
from schemas import RunSpec
from schemas.progress import ServerSnapshot
from tokenmill.commandline import service_command
from tokenmill.flag_types import RUN_ID, seconds
from tokenmill.kafka import clients, groups, topics
from tokenmill.kafka.groups import GroupState
from tokenmill.progress import GLANCE_SETTLE_S, RunProgress, read_run_progress
from tokenmill.registry import RunRegistry, source_prompts_topic
from tokenmill.settings import Settings

STATUS_SCHEMA_PATH = Path(__file__).with_name("status.schema.json")


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def _duration(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds == float("inf"):
        return "-"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


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


def render(spec: RunSpec, s: dict[str, Any]) -> Group:
    """The report: a table per question, then the S3 line, the verdict and
    the problems."""
    health: Health = s["health"]
    parts: list[Any] = [Panel(_header(spec, s)), _stages(s), _speed(s), _quality(s),
                        _coverage(s), _workers(s)]
    gpus = render_gpus(s["instances"])
    if gpus is not None:
        parts.append(gpus)
    sinks = render_sinks(s["sinks"])
    if sinks is not None:
        parts.append(sinks)
    parts += [_s3_line(spec, s), _verdict(health)]
    parts += [Text(problem.line(), style="red" if problem.severity == "critical" else "yellow")
              for problem in health.problems]
    return Group(*parts)


def _header(spec: RunSpec, s: dict[str, Any]) -> str:
    g = spec.generation
    return (f"[bold]{spec.run_id}[/]  model {g.model}  max_tokens {g.max_tokens}  "
            f"thinking {'on' if g.enable_thinking else 'off'}  temperature {g.temperature}  "
            f"multi-turn {spec.multi_turn}  tools {g.tools}  partitions {spec.partitions}  "
            f"settings {s['settings_hash']}")


def _stages(s: dict[str, Any]) -> Table:
    stages = Table(title="progress", expand=True)
    for column in ("stage", "done", "of", "%", "note"):
        stages.add_column(column, justify="right" if column in ("done", "of", "%") else "left")
    total = s["total"]
    stages.add_row("published", f"{s['published']:,}", f"{total:,}", _pct(s["published"], total),
                   "complete" if s["publishing_done"] else "publishing")
    stages.add_row("generated", f"{s['generated']:,}", f"{s['published']:,}",
                   _pct(s["generated"], total),
                   f"{s['completions']:,} completions, {s['failures']:,} failures")
    conversations = s.get("conversations")
    if conversations:
        stages.add_row("conversations", f"{conversations['finished'] + conversations['failed']:,}",
                       f"{s['published']:,}", _pct(conversations["finished"]
                                                   + conversations["failed"], total),
                       f"{conversations['turns']:,} turns generated, "
                       f"{conversations['in_progress']:,} in progress, "
                       f"{conversations['failed']:,} failed (dead-lettered)")
    stages.add_row("persisted", f"{s['persisted']:,}", f"{s['generated']:,}",
                   _pct(s["persisted"], total),
                   f"{s['s3_records']:,} in S3, {s['dlq_records']:,} in DLQ")
    return stages


def _speed(s: dict[str, Any]) -> Table:
    total = s["total"]
    source = {"plan": " (from the plan)", "flags": ""}.get(s["estimate_source"] or "flags", "")
    window = s["recent_window_s"]
    recent_title = f"live, last {_duration(window)}" if window else "live workers"
    speed = Table(title=f"speed vs estimate{source}", expand=True)
    for column in ("", recent_title, "run average", "estimate", "ratio"):
        speed.add_column(column)
    est_rps = s["estimate_requests_per_s"]
    recent_rps = s["recent_requests_per_s"]
    speed.add_row("requests/s", f"{recent_rps:.2f}", f"{s['requests_per_s']:.2f}",
                  f"{est_rps:.2f}" if est_rps else "-",
                  f"{recent_rps / est_rps:.2f}x" if est_rps else "-")
    est_tok = s["estimate_output_tokens"]
    mean_tok = s["mean_output_tokens"]
    speed.add_row("tokens/completion", "", f"{mean_tok:,.0f}" if mean_tok else "-",
                  f"{est_tok:,.0f}" if est_tok else "-",
                  f"{mean_tok / est_tok:.2f}x" if mean_tok and est_tok else "-")
    est_tok_s = s["estimate_tokens_per_s"]
    speed.add_row("output tokens/s", f"{s['recent_tokens_per_s']:,.0f}",
                  f"{s['tokens_per_s']:,.0f}", f"{est_tok_s:,.0f}" if est_tok_s else "-",
                  f"{s['recent_tokens_per_s'] / est_tok_s:.2f}x" if est_tok_s else "-")
    truncated, est_truncated = s["truncated_share"], s["estimate_truncated_share"]
    if est_truncated is not None:
        speed.add_row("truncated (length)", "",
                      _pct(truncated, 1) if truncated is not None else "-",
                      _pct(est_truncated, 1), "")
    if s["estimate_concurrency"]:
        speed.add_row("concurrency per GPU", "", "", str(s["estimate_concurrency"]), "")
    eta_estimate = (total - s["generated"]) / est_rps if est_rps else None
    speed.add_row("ETA", _duration(s["recent_eta_s"]), _duration(s["eta_s"]),
                  _duration(eta_estimate), "")
    speed.add_row("elapsed", "", _duration(s["elapsed_s"]), "", "")
    return speed


def _quality(s: dict[str, Any]) -> Table:
    quality = Table(title="quality", expand=True)
    quality.add_column("what")
    quality.add_column("count", justify="right")
    quality.add_column("share", justify="right")
    for reason, count in sorted(s["finish_reasons"].items()):
        quality.add_row(f"finish {reason}", f"{count:,}", _pct(count, s["completions"]))
    for kind, count in sorted(s["failures_by_kind"].items()):
        quality.add_row(f"failed: {kind}", f"{count:,}", _pct(count, s["generated"]))
    for reason, count in sorted(s["dlq_by_reason"].items()):
        quality.add_row(f"DLQ: {reason}", f"{count:,}", _pct(count, s["persisted"]))
    accept = s["accept_length"]
    quality.add_row("speculative accept length",
                    f"{accept:.2f}" if accept else "off / not reported", "")
    share = s["reasoning_share"]
    quality.add_row("reasoning share of output", "", f"{100 * share:.0f}%" if share else "-")
    return quality


def _coverage(s: dict[str, Any]) -> Table:
    coverage = Table(title="coverage by category", expand=True)
    for column in ("category", "planned", "generated", "%"):
        coverage.add_column(column, justify="left" if column == "category" else "right")
    planned: Counter[str] = Counter(s["planned_by_category"])
    generated: Counter[str] = Counter(s["generated_by_category"])
    for category in sorted(set(planned) | set(generated)):
        coverage.add_row(category, f"{planned[category]:,}" if planned else "?",
                         f"{generated[category]:,}", _pct(generated[category], planned[category]))
    sources = ", ".join(f"{k} {v:,}" for k, v in sorted(s["planned_by_source"].items()))
    coverage.caption = (f"rejected {s['rejected']:,}, duplicates skipped {s['duplicates']:,}; "
                        f"sources: {sources or '?'}")
    return coverage


def _workers(s: dict[str, Any]) -> Table:
    workers = Table(title="workers (one per GPU)", expand=True)
    for column in ("instance", "state", "completions", "failures", "tok/s now", "tok/s avg",
                   "accept", "limit", "in flight", "heartbeat", "last result"):
        workers.add_column(column, justify="left" if column in ("instance", "state")
                           else "right")
    for w in s["instances"]:
        live = is_live(w["state"])
        workers.add_row(Text(w["instance"]), _state(w["state"], w["breaker"]),
                        f"{w['completions']:,}", f"{w['failures']:,}",
                        f"{w['recent_tokens_per_s']:,.0f}" if live else "-",
                        f"{w['tokens_per_s']:,.0f}",
                        f"{w['accept_length']:.2f}" if w["accept_length"] else "-",
                        str(w["concurrency_limit"] or "-"), str(w["in_flight"]) if live else "-",
                        _ago(w["last_commit_age_s"]), _ago(w["last_result_age_s"]))
    return workers


def _s3_line(spec: RunSpec, s: dict[str, Any]) -> str:
    s3 = spec.s3
    where = f"s3://{s3.bucket}/{s3.prefix}" if s3 else "(bucket from the sink's settings)"
    return (f"S3: {s['s3_objects']:,} objects, {s['s3_bytes'] / 1e6:,.1f} MB at {where}; "
            f"last object {s['last_object'] or '-'}")


def _verdict(health: Health) -> Text:
    return {
        "complete": Text("complete: every published prompt is persisted", style="green"),
        "running": Text("running", style="green" if not health.problems else "yellow"),
        "stalled": Text("STALLED: nothing can make progress (see below)", style="bold red"),
        "waiting": Text("waiting: nothing published yet", style="yellow"),
    }[health.state]


_STATE_STYLE = {"active": "green", "stale": "yellow", "stopped": "dim", "dead": "bold red"}


def _state(state: MemberState, breaker: str = "") -> Text:
    text = Text(state, style=_STATE_STYLE.get(state, ""))
    if breaker and is_live(state):
        text.append(" (breaker open)", style="yellow")
    return text


def _ago(seconds: float | None) -> str:
    return "-" if seconds is None else f"{_duration(seconds)} ago"


def render_gpus(instances: list[dict[str, Any]]) -> Table | None:
    """The GPU's side, from each worker's SGLang server: can the batch grow?"""
    rows = [w for w in instances if w["server"] is not None]
    if not rows:
        return None
    table = Table(title="GPUs (from each SGLang server's /metrics and /get_server_info)",
                  expand=True)
    for column in ("worker", "running", "queued", "max running", "KV cache", "gen tok/s",
                   "accept", "batch can grow?"):
        table.add_column(column, justify="left" if column in ("worker", "batch can grow?")
                         else "right")
    for w in rows:
        server: ServerSnapshot = w["server"]
        room = w["headroom"]
        answer = Text(room.verdict, style={"yes": "green", "no": "yellow"}.get(room.verdict, ""))
        answer.append(f": {room.reason}")
        table.add_row(Text(w["instance"]), f"{server.running:.0f}", f"{server.queued:.0f}",
                      str(server.max_running_requests or "-"),
                      f"{100 * server.token_usage:.0f}%", f"{server.gen_throughput:,.0f}",
                      f"{server.accept_length:.2f}" if server.accept_length else "-", answer)
    return table


def render_sinks(sinks: list[dict[str, Any]]) -> Table | None:
    if not sinks:
        return None
    table = Table(title="sinks", expand=True)
    for column in ("instance", "state", "heartbeat", "last upload", "objects", "MB", "in S3",
                   "in DLQ", "waiting", "uploading for", "S3 errors"):
        table.add_column(column, justify="left" if column in ("instance", "state", "S3 errors")
                         else "right")
    for k in sinks:
        errors = Text(f"{k['upload_errors']}" if k["upload_errors"] else "-")
        if k["last_error"] and k["last_error_age_s"] is not None:
            errors.append(f" (last {_duration(k['last_error_age_s'])} ago: {k['last_error']})",
                          style="yellow")
        table.add_row(Text(k["instance"]), _state(k["state"]), _ago(k["last_commit_age_s"]),
                      _ago(k["last_upload_age_s"]), f"{k['s3_objects']:,}",
                      f"{k['s3_bytes'] / 1e6:,.1f}", f"{k['s3_records']:,}",
                      f"{k['dlq_records']:,}", f"{k['waiting_records']:,}",
                      _duration(k["uploading_for_s"]) if k["uploading_for_s"] else "-", errors)
    return table


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


def render_group(group: dict[str, Any]) -> Table:
    table = Table(title="group members (tokenmill.<run>.generate)"
                  + ("" if group["stable"] else " - rebalancing"), expand=True)
    for column in ("worker", "members", "standbys", "partitions", "share of the run"):
        table.add_column(column, justify="left" if column in ("worker", "partitions") else "right")
    for name, row in group["workers"].items():
        table.add_row(name, str(row["slots"]), str(row["standbys"]),
                      ", ".join(map(str, row["partitions"])) or "-", f"{100 * row['share']:.0f}%")
    if group["unowned"]:
        table.add_row("[red]owned by no member[/]", "", "",
                      ", ".join(f"{p} ({age:.0f}s)" for p, age in group["unowned"].items()), "")
    return table


def read_group(settings: Settings, spec: RunSpec) -> GroupState | None:
    try:
        return groups.describe(clients.admin(settings), topics.generate_group(spec.run_id),
                               source_prompts_topic(spec), settings.connect_timeout_s)
    except KafkaException:
        return None


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
    registry = RunRegistry(settings)
    specs = registry.all()
    spec = registry.get(run_id, specs)
    console = Console()
    unowned_since: dict[int, float] = {}
    # The group and the counters are read side by side: each is a few round
    # trips to the brokers, and a fleet starting on the same machine makes
    # every one of them wait for a CPU (the seed run: 4.3 s at its launch).
    looks = ThreadPoolExecutor(1, thread_name_prefix="status-group")
    while True:
        reading_group = looks.submit(read_group, settings, spec)
        glance = read_run_progress(settings, run_id, settle_s=GLANCE_SETTLE_S)
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
            if watch > 0 and console.is_terminal:
                console.clear()  # a live view, not a scrolling log
            console.print(render(spec, summary))
            if group is not None and group["workers"]:
                console.print(render_group(group))
            if coverage is not None:
                console.print(coverage_line(coverage))
        if watch <= 0:
            return
        time.sleep(watch)
        specs = registry.all()  # a redrive or replay of the run may be registered since
