"""`tokenmill plan`, start to end: read and sample the dataset, then either
calibrate against a server or take the operator's figures, and build the plan.

Ctrl-C during calibration stops the sweep and builds the plan from what was
measured so far (the plan says so); a second Ctrl-C aborts.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)

from consumer.sglang_client import SGLangClient, request_body
from ops.plan.build import Costing, ServerInfo, calibrated_plan, flags_plan
from ops.plan.calibrate import Sweep, SweepResult, SweepStatus, level_durations
from ops.plan.dataset import DatasetSample, read_sample
from schemas.plan import Plan
from schemas.run import GenerationSettings, MultiTurnPolicy, ToolMode
from tokenmill.log import get_logger
from tokenmill.settings import Secret

log = get_logger("tokenmill.plan")

LEVEL_SHARE = 0.5  # of the budget, spread over the levels; the rest sends the sample and drains
DEFAULT_MAX_CONCURRENCY = 256


class PlanError(Exception):
    """A plan cannot be made (server unreachable, nothing measured)."""


@dataclass(frozen=True)
class PlanOptions:
    files: tuple[Path, ...]
    multi_turn: MultiTurnPolicy
    tools: ToolMode
    sample_size: int
    seed: int
    costing: Costing
    sglang_url: str | None = None
    time_budget_s: float = 300.0
    levels: tuple[int, ...] | None = None  # None: powers of two up to max_concurrency
    max_concurrency: int | None = None  # None: twice the server's limit, else 256
    model: str = "default"
    thinking: bool = True
    api_key: Secret | None = None
    estimate_rps: float | None = None
    estimate_output_tokens: float | None = None
    show_progress: bool | None = None
    scratch: Path | None = None  # where the reading spool goes (<state-dir>/plan)


def make_plan(options: PlanOptions, err: Console) -> Plan:
    sample = _read(options, err)
    if not sample.prompts:
        raise PlanError("no prompt accepted from the input files: nothing to plan")
    if options.sglang_url is None:
        assert options.estimate_rps is not None and options.estimate_output_tokens is not None
        return flags_plan(sample, requests_per_s=options.estimate_rps,
                          output_tokens=options.estimate_output_tokens, costing=options.costing)
    return asyncio.run(_calibrate(options, sample, err))


def powers_of_two(highest: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to and including `highest` (which ends the list)."""
    levels = []
    c = 1
    while c < highest:
        levels.append(c)
        c *= 2
    levels.append(highest)
    return tuple(levels)


def public_url(url: str) -> str:
    """The URL without credentials, for the plan file and logs."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _bars(console: Console, enabled: bool | None) -> Progress:
    return Progress(TextColumn("[bold]{task.description:<28}"), BarColumn(bar_width=24),
                    TaskProgressColumn(), TextColumn("{task.fields[detail]}"),
                    TimeElapsedColumn(), console=console,
                    disable=not (console.is_terminal if enabled is None else enabled))


def _read(options: PlanOptions, err: Console) -> DatasetSample:
    with _bars(err, options.show_progress) as bars:
        task = bars.add_task("reading the dataset", total=1, detail="")

        def total(size: int) -> None:
            bars.update(task, total=max(size, 1))

        def progress(done: int, records: int) -> None:
            bars.update(task, completed=done, detail=f"{records:,} records")

        return read_sample(list(options.files), multi_turn=options.multi_turn,
                           tools=options.tools, size=options.sample_size, seed=options.seed,
                           scratch=options.scratch, progress=progress, total_bytes=total)


@contextlib.contextmanager
def _ctrl_c_stops(stop: asyncio.Event, err: Console) -> Iterator[None]:
    """First Ctrl-C: stop and keep what was measured; second: abort."""
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()

    def on_sigint() -> None:
        if stop.is_set():
            if main is not None:
                main.cancel()
            return
        stop.set()
        err.print("[yellow]stopping calibration: the plan uses what was measured so far "
                  "(Ctrl-C again to abort)[/]")

    try:
        loop.add_signal_handler(signal.SIGINT, on_sigint)
        installed = True
    except (NotImplementedError, RuntimeError):  # not the main thread
        installed = False
    try:
        yield
    finally:
        if installed:
            loop.remove_signal_handler(signal.SIGINT)


async def _calibrate(options: PlanOptions, sample: DatasetSample, err: Console) -> Plan:
    assert options.sglang_url is not None
    url = options.sglang_url
    costing = options.costing
    settings = GenerationSettings(model=options.model, max_tokens=costing.candidates[-1],
                                  enable_thinking=options.thinking, tools=options.tools)
    bodies = [request_body(p.prompt, settings) for p in sample.prompts]
    async with SGLangClient(url, max_connections=4096, api_key=options.api_key) as client:
        if not await client.healthy():
            raise PlanError(f"the server at {public_url(url)} does not answer /health with 200 "
                            "(not running, or still loading)")
        server_limit = await client.max_running_requests()
        levels = options.levels or powers_of_two(
            options.max_concurrency or (2 * server_limit if server_limit else
                                        DEFAULT_MAX_CONCURRENCY))
        durations = level_durations(list(levels), options.time_budget_s * LEVEL_SHARE)
        log.info("calibrating", server=public_url(url), levels=list(levels),
                 level_seconds=[round(d, 1) for d in durations], sample=len(bodies),
                 max_tokens=settings.max_tokens, server_max_running_requests=server_limit)
        stop = asyncio.Event()
        with _bars(err, options.show_progress) as bars, _ctrl_c_stops(stop, err):
            task = bars.add_task("calibrating", total=options.time_budget_s, detail="")

            def show(status: SweepStatus) -> None:
                bars.update(task, completed=min(status.elapsed, options.time_budget_s),
                            description=f"{status.phase} c={status.concurrency} "
                                        f"({status.level + 1}/{len(levels)})",
                            detail=f"answers {status.answered}/{status.sample}, "
                                   f"{status.in_flight} in flight, "
                                   f"{status.tokens / max(status.elapsed, 1e-9):,.0f} tok/s")

            sweep = Sweep(client, bodies, list(levels), durations=durations,
                          budget_s=options.time_budget_s, on_status=show)
            result: SweepResult = await sweep.run(stop)
            bars.update(task, completed=options.time_budget_s)
    if result.interrupted:
        err.print("[yellow]calibration interrupted: the plan below is what was measured "
                  "until then[/]")
    server = ServerInfo(url=public_url(url), model=options.model,
                        max_running_requests=server_limit, time_budget_s=options.time_budget_s)
    try:
        return calibrated_plan(sample, result, server, costing)
    except ValueError as exc:
        raise PlanError(str(exc)) from None
