"""Is a run healthy? The judgement behind `tokenmill status` and
`status --check`, from committed progress records alone (pure: every rule
is tested directly).

A member (worker or sink instance) commits at least every `heartbeat_s`
even when idle, so the age of its last record says whether the process
lives: older than twice its heartbeat means dead, unless its last record
says it stopped cleanly. Dead members stop counting toward rates and
in-flight. A run with work left is stalled when nothing can make progress
(no live worker, no live sink) or nothing did for `stall_after_s`.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from schemas.progress import ConsumerProgress, ServerSnapshot, SinkProgress
from tokenmill.progress import RunProgress

MemberState = Literal["active", "stale", "stopped", "dead"]
Severity = Literal["warning", "critical"]
RunState = Literal["complete", "running", "stalled", "waiting"]

DEFAULT_HEARTBEAT_S = 10.0  # members that predate the heartbeat field
STALE_AFTER = 1.5  # heartbeat intervals
DEAD_AFTER = 2.0
MIN_SAMPLE = 50  # results before failure and truncation shares are judged


class Thresholds(msgspec.Struct, frozen=True, kw_only=True):
    stall_after_s: float = 600.0  # no result committed for this long: stalled
    max_failure_share: float = 0.05  # of generated records
    max_truncated_share: float = 0.25  # finish reason `length`, of completions
    max_dlq_share: float = 0.30  # of persisted records
    upload_stall_s: float = 120.0  # an S3 upload in flight this long
    unowned_after_s: float = 60.0  # a partition owned by no group member this long


class Problem(msgspec.Struct, frozen=True):
    severity: Severity
    subject: str  # "run", "worker gpu0", "sink sink0", "partition 3"
    message: str

    def line(self) -> str:
        return f"{self.severity.upper()}: {self.subject}: {self.message}"


class Headroom(msgspec.Struct, frozen=True):
    """Can this GPU's batch grow? From its SGLang server's own numbers."""

    verdict: Literal["yes", "no", "unknown"]
    reason: str


class MemberHealth(msgspec.Struct, frozen=True, kw_only=True):
    kind: Literal["worker", "sink"]
    instance: str
    state: MemberState
    heartbeat_age_s: float
    heartbeat_s: float
    last_work_age_s: float | None  # since its last committed result / upload
    headroom: Headroom | None = None  # workers only


class Health(msgspec.Struct, frozen=True, kw_only=True):
    state: RunState
    members: list[MemberHealth]
    problems: list[Problem]
    last_work_age_s: float | None  # since the newest committed result or upload of the run

    @property
    def exit_code(self) -> int:
        """`status --check`: 0 healthy, 1 warning, 2 critical."""
        severities = {p.severity for p in self.problems}
        return 2 if "critical" in severities else 1 if severities else 0


def member_state(updated_at: float, heartbeat_s: float, stopped_at: float,
                 now: float) -> MemberState:
    if stopped_at and stopped_at >= updated_at:
        return "stopped"
    beat = heartbeat_s or DEFAULT_HEARTBEAT_S
    age = now - updated_at
    if age > DEAD_AFTER * beat:
        return "dead"
    if age > STALE_AFTER * beat:
        return "stale"
    return "active"


def is_live(state: MemberState) -> bool:
    return state in ("active", "stale")


def headroom(server: ServerSnapshot | None) -> Headroom:
    """KV cache use and queue depth against the server's limit. A batch can
    grow while the KV cache has room and the server runs fewer requests than
    `max_running_requests`; a full cache or a queue means it cannot."""
    if server is None or not server.at:
        return Headroom("unknown", "no metrics from the SGLang server yet")
    usage = f"KV cache {100 * server.token_usage:.0f}% used"
    limit = server.max_running_requests
    running = f"{server.running:.0f} running" + (f" of max {limit}" if limit else "")
    if server.token_usage >= 0.9:
        return Headroom("no", f"{usage}: more requests would wait for memory ({running})")
    if server.queued > 0:
        return Headroom("no", f"{server.queued:.0f} queued at the server, {running}, {usage}")
    if limit and server.running >= limit:
        return Headroom("no", f"at max_running_requests ({running}), {usage}")
    if server.token_usage < 0.7 and (not limit or server.running < 0.9 * limit):
        return Headroom("yes", f"{usage}, {running}: raise --concurrency (or let auto)")
    return Headroom("no", f"{usage}, {running}: close to the limit")


def _worker(c: ConsumerProgress, now: float) -> MemberHealth:
    work_at = c.last_work_at or (c.updated_at if c.completions + c.failures else 0.0)
    return MemberHealth(kind="worker", instance=c.instance,
                        state=member_state(c.updated_at, c.heartbeat_s, c.stopped_at, now),
                        heartbeat_age_s=now - c.updated_at,
                        heartbeat_s=c.heartbeat_s or DEFAULT_HEARTBEAT_S,
                        last_work_age_s=(now - work_at) if work_at else None,
                        headroom=headroom(c.server))


def _sink(s: SinkProgress, now: float) -> MemberHealth:
    work_at = s.last_upload_at or (s.updated_at if s.s3_records + s.dlq_records else 0.0)
    return MemberHealth(kind="sink", instance=s.instance,
                        state=member_state(s.updated_at, s.heartbeat_s, s.stopped_at, now),
                        heartbeat_age_s=now - s.updated_at,
                        heartbeat_s=s.heartbeat_s or DEFAULT_HEARTBEAT_S,
                        last_work_age_s=(now - work_at) if work_at else None)


def _age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _heartbeat_problems(members: list[MemberHealth]) -> list[Problem]:
    """Members whose last record is late: stale, or dead (no longer counted)."""
    problems: list[Problem] = []
    for member in members:
        subject = f"{member.kind} {member.instance}"
        if member.state == "dead":
            problems.append(Problem(
                "warning", subject, f"dead: last heartbeat {_age(member.heartbeat_age_s)}"
                f" ago (expected every {member.heartbeat_s:g}s)"))
        elif member.state == "stale":
            problems.append(Problem("warning", subject,
                                    f"stale: last heartbeat {_age(member.heartbeat_age_s)} ago"))
    return problems


def _dead_list(names: dict[str, MemberHealth]) -> str:
    return f" (dead: {', '.join(sorted(names))})" if names else ""


def _unstaffed_problems(to_generate: int, to_persist: int,
                        workers: dict[str, MemberHealth], sinks: dict[str, MemberHealth],
                        live_workers: list[MemberHealth],
                        live_sinks: list[MemberHealth]) -> list[Problem]:
    """Work waiting with no live member to do it: each one stalls the run."""
    problems: list[Problem] = []
    if to_generate and not live_workers:
        problems.append(Problem("critical", "run",
                                f"stalled: no live worker, {to_generate:,} published prompts "
                                "wait for generation" + _dead_list(workers)))
    if to_persist and not live_sinks:
        problems.append(Problem("critical", "run",
                                f"stalled: no live sink, {to_persist:,} results wait to be "
                                "persisted" + _dead_list(sinks)))
    return problems


def _open_breakers(state: RunProgress, workers: dict[str, MemberHealth]) -> dict[str, str]:
    """Live workers whose circuit breaker is open, and its cause."""
    return {c.instance: c.breaker for c in state.consumers.values()
            if c.breaker and is_live(workers[c.instance].state)}


def _breaker_problems(open_breakers: dict[str, str]) -> list[Problem]:
    return [Problem("warning", f"worker {instance}",
                    f"circuit breaker open: its server fails requests ({cause})")
            for instance, cause in sorted(open_breakers.items())]


def _unowned_problems(unowned: dict[int, float], to_generate: int,
                      t: Thresholds) -> list[Problem]:
    """Partitions with prompts to generate that no worker has owned for long."""
    return [Problem("warning", f"partition {p}", f"owned by no worker for {_age(seconds)}")
            for p, seconds in sorted(unowned.items())
            if seconds >= t.unowned_after_s and to_generate]


def _idle_reasons(state: RunProgress, workers: dict[str, MemberHealth],
                  live_workers: list[MemberHealth], open_breakers: dict[str, str],
                  unowned: dict[int, float], t: Thresholds) -> list[str]:
    """What may keep live members from committing: the guesses an idle
    stall names for the operator."""
    reasons = []
    if open_breakers and len(open_breakers) == len(live_workers):
        reasons.append("every live worker's server is failing")
    if any(s >= t.unowned_after_s for s in unowned.values()):
        reasons.append("partitions owned by no worker")
    wedged = [c.instance for c in state.consumers.values()
              if is_live(workers[c.instance].state) and (c.partitions or c.in_flight)
              and not c.breaker]
    if wedged:
        reasons.append(f"wedged? {', '.join(sorted(wedged))} heartbeat and hold "
                       "partitions or requests but commit no results")
    return reasons


def _idle_stall(idle_for: float, reasons: list[str]) -> Problem:
    return Problem("critical", "run", f"stalled: nothing committed for {_age(idle_for)}"
                   + (f" ({'; '.join(reasons)})" if reasons else ""))


def _upload_problems(state: RunProgress, sinks: dict[str, MemberHealth], now: float,
                     t: Thresholds) -> list[Problem]:
    """Live sinks whose S3 upload hangs or keeps failing."""
    problems: list[Problem] = []
    for s in state.sinks.values():
        if not is_live(sinks[s.instance].state):
            continue
        subject = f"sink {s.instance}"
        if s.uploading_since and now - s.uploading_since >= t.upload_stall_s:
            problems.append(Problem(
                "warning", subject, f"S3 upload in flight for {_age(now - s.uploading_since)}"
                + (f"; {s.upload_errors} failed attempts, last: {s.last_error}"
                   if s.upload_errors else "")))
        elif s.upload_errors:
            problems.append(Problem("warning", subject,
                                    f"{s.upload_errors} failed S3 attempts (retried); last: "
                                    f"{s.last_error}"))
    return problems


def _sink_exit_problems(state: RunProgress, sinks: dict[str, MemberHealth]) -> list[Problem]:
    """Dead sinks whose last record is the error they exited on."""
    return [Problem("critical", f"sink {s.instance}", f"exited on: {s.last_error}")
            for s in state.sinks.values()
            if sinks[s.instance].state == "dead" and s.last_error
            and s.last_error_at >= s.updated_at - 1]


def _quality_problems(state: RunProgress, t: Thresholds) -> list[Problem]:
    """Shares of failures, truncated answers and dead letters over their
    thresholds, once there are enough results to judge."""
    problems: list[Problem] = []
    generated = state.generated
    failures = int(state.consumer_total("failures"))
    if generated >= MIN_SAMPLE and failures / generated > t.max_failure_share:
        problems.append(Problem("critical", "run", f"{100 * failures / generated:.1f}% of "
                                f"results are failures (threshold "
                                f"{100 * t.max_failure_share:g}%)"))
    finish = state.consumer_counter("finish_reasons")
    completed = sum(finish.values())
    truncated = finish.get("length", 0)
    if completed >= MIN_SAMPLE and truncated / completed > t.max_truncated_share:
        problems.append(Problem("warning", "run", f"{100 * truncated / completed:.1f}% of "
                                f"answers truncated at max_tokens (threshold "
                                f"{100 * t.max_truncated_share:g}%)"))
    persisted = state.persisted
    dlq = sum(s.dlq_records for s in state.sinks.values())
    if persisted >= MIN_SAMPLE and dlq / persisted > t.max_dlq_share:
        problems.append(Problem("warning", "run", f"{100 * dlq / persisted:.1f}% of results "
                                f"went to the dead-letter topic (threshold "
                                f"{100 * t.max_dlq_share:g}%)"))
    return problems


def _run_state(state: RunProgress, stalled: bool) -> RunState:
    if state.sink_done:
        return "complete"
    if stalled:
        return "stalled"
    if not state.producer:
        return "waiting"
    return "running"


def assess(state: RunProgress, now: float, thresholds: Thresholds = Thresholds(),
           unowned: dict[int, float] | None = None) -> Health:
    """`unowned`: partitions of the generate group owned by no member, and
    for how many seconds (from `status`'s look at the group; None: unknown)."""
    t = thresholds
    unowned = unowned or {}
    workers = {c.instance: _worker(c, now) for c in state.consumers.values()}
    sinks = {s.instance: _sink(s, now) for s in state.sinks.values()}
    problems: list[Problem] = []
    to_generate = max(0, state.published - state.generated)
    to_persist = max(0, state.generated - state.persisted)
    live_workers = [w for w in workers.values() if is_live(w.state)]
    live_sinks = [s for s in sinks.values() if is_live(s.state)]
    ages = [m.last_work_age_s for m in [*workers.values(), *sinks.values()]
            if m.last_work_age_s is not None]
    last_work = min(ages) if ages else None
    stalled = False

    if not state.sink_done:
        problems += _heartbeat_problems([*workers.values(), *sinks.values()])
        unstaffed = _unstaffed_problems(to_generate, to_persist, workers, sinks,
                                        live_workers, live_sinks)
        problems += unstaffed
        stalled = bool(unstaffed)
        open_breakers = _open_breakers(state, workers)
        problems += _breaker_problems(open_breakers)
        problems += _unowned_problems(unowned, to_generate, t)
        if (not stalled and (to_generate or to_persist) and (live_workers or live_sinks)
                and last_work is not None and last_work > t.stall_after_s):
            stalled = True
            problems.append(_idle_stall(last_work, _idle_reasons(
                state, workers, live_workers, open_breakers, unowned, t)))
        problems += _upload_problems(state, sinks, now, t)
        problems += _sink_exit_problems(state, sinks)
    problems += _quality_problems(state, t)

    members = [*sorted(workers.values(), key=lambda m: m.instance),
               *sorted(sinks.values(), key=lambda m: m.instance)]
    return Health(state=_run_state(state, stalled), members=members, problems=problems,
                  last_work_age_s=last_work)


def live_rates(state: RunProgress, health: Health) -> tuple[float, float, float | None]:
    """Requests/s and tokens/s of the live workers over their recent
    windows, and the shortest window (None: no live worker reported one)."""
    live = {m.instance for m in health.members if m.kind == "worker" and is_live(m.state)}
    chosen = [c for c in state.consumers.values() if c.instance in live and c.recent_window_s]
    return (sum(c.recent_requests_per_s for c in chosen),
            sum(c.recent_tokens_per_s for c in chosen),
            min((c.recent_window_s for c in chosen), default=None))
