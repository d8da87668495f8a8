"""`tokenmill status` on a terminal: the report's tables, drawn with rich from
the numbers `ops.status.summarize` computes.

Apart from the command so that `status --json` and `status --check` do not
import rich (about 20 ms of CPU a look; a look at a starting fleet waits for
a core for every one of them).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ops.health import Health, MemberState, is_live
from schemas import RunSpec
from schemas.progress import ServerSnapshot


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def _duration(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds == float("inf"):
        return "-"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


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
