"""`tokenmill plan`: flags -> PlanOptions; the work is in runner.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

import click
import msgspec
from rich.console import Console

from consumer.sglang_client import ServerMisconfigured
from ops.plan.build import Costing
from ops.plan.report import render
from ops.plan.runner import PlanError, PlanOptions, make_plan
from producer.errors import ProducerError
from schemas.run import MultiTurnPolicy, ToolMode
from tokenmill.commandline import register_known_error, service_command
from tokenmill.settings import Settings, sglang_api_key

# one line for the operator, no traceback: the server refused every request
# (401/403/404), or the plan cannot be made, or the inputs are unreadable
register_known_error(PlanError, ProducerError, ServerMisconfigured)

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h)?\s*$")
_UNITS = {None: 1.0, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """'300', '90s', '5m', '1.5h' -> seconds."""
    match = _DURATION.match(text)
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"invalid duration {text!r}: use seconds or a number with s, m or h "
                         "(e.g. 90s, 5m, 1h)")
    return float(match.group(1)) * _UNITS[match.group(2)]


def parse_int_list(text: str, name: str) -> tuple[int, ...]:
    """'4096,8192' -> (4096, 8192), ascending and distinct, each >= 1."""
    try:
        values = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise click.BadParameter(f"expected comma-separated whole numbers, got {text!r}",
                                 param_hint=name) from None
    if not values or values[0] < 1:
        raise click.BadParameter(f"expected numbers >= 1, got {text!r}", param_hint=name)
    return tuple(values)


@click.command("plan")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--sglang-url", envvar="TOKENMILL_SGLANG_URL", default=None,
              help="One server to calibrate against (SGLang or OpenAI-compatible) "
                   "[env: TOKENMILL_SGLANG_URL].")
@click.option("--sample", "sample_size", type=click.IntRange(min=1), default=300,
              show_default=True, help="Prompts to sample (stratified by source and category).")
@click.option("--gpus", type=click.IntRange(min=1), default=7, show_default=True,
              help="GPUs (one server each) the run will use.")
@click.option("--gpu-hour-cost", type=click.FloatRange(min=0.0), default=4.5,
              show_default=True, help="Price of one GPU-hour.")
@click.option("--max-tokens", "max_tokens", default="4096,8192,16384", show_default=True,
              help="Candidate max_tokens; the sample is generated with the largest.")
@click.option("--time-budget", default="5m", show_default=True,
              help="Calibration time at most (90s, 5m, 1h).")
@click.option("--seed", type=int, default=0, show_default=True, help="Sample seed.")
@click.option("--max-concurrency", type=click.IntRange(min=1), default=None,
              help="Highest concurrency level [default: twice the server's "
                   "max_running_requests, else 256]; levels are powers of two up to it.")
@click.option("--concurrency-levels", default=None,
              help="Explicit levels instead, e.g. 8,16,32,48,64.")
@click.option("--model", default="default", show_default=True, help="Model name for requests.")
@click.option("--thinking/--no-thinking", default=True, show_default=True,
              help="Ask for the model's reasoning (as the run will).")
@click.option("--multi-turn", type=click.Choice(list(get_args(MultiTurnPolicy))),
              default="last-user", show_default=True, help="As for produce.")
@click.option("--tools", "tool_mode", type=click.Choice(["structured", "as-given"]),
              default="structured", show_default=True, help="As for produce.")
@click.option("--estimate-rps", type=click.FloatRange(min=0.0, min_open=True), default=None,
              help="No server: requests/s of all GPUs together.")
@click.option("--estimate-output-tokens", type=click.FloatRange(min=0.0, min_open=True),
              default=None, help="No server: output tokens per answer.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON (stdout).")
@click.option("--output", "-o", "output", type=click.Path(path_type=Path), default=None,
              help="Also write the plan JSON to this file (for produce --plan).")
@click.option("--progress/--no-progress", "show_progress", default=None,
              help="Progress bars on stderr [default: when stderr is a terminal].")
@service_command
def plan(settings: Settings, files: tuple[Path, ...], sglang_url: str | None, sample_size: int,
         gpus: int, gpu_hour_cost: float, max_tokens: str, time_budget: str, seed: int,
         max_concurrency: int | None, concurrency_levels: str | None, model: str,
         thinking: bool, multi_turn: MultiTurnPolicy, tool_mode: ToolMode,
         estimate_rps: float | None,
         estimate_output_tokens: float | None, as_json: bool, output: Path | None,
         show_progress: bool | None) -> None:
    """Predict time, tokens, truncation and cost of a dataset before renting GPUs.

    Reads the files as `tokenmill produce` would, samples prompts by source and
    category, sends them to one server at rising concurrency within the time
    budget, fits throughput against concurrency (the knee is the recommended
    concurrency) and, from the sample's answer lengths, predicts for each
    candidate max_tokens the share truncated, output tokens, hours on --gpus
    GPUs and cost. Without a server, --estimate-rps and
    --estimate-output-tokens give hours, tokens and cost.

    \b
    Examples:
      tokenmill plan data/*.jsonl --sglang-url http://gpu-1:30000 -o plan.json
      tokenmill plan data/*.jsonl --estimate-rps 5.6 --estimate-output-tokens 2306
    """
    estimates = (estimate_rps, estimate_output_tokens)
    if sglang_url and any(v is not None for v in estimates):
        raise click.UsageError("give --sglang-url to measure, or --estimate-rps and "
                               "--estimate-output-tokens, not both")
    if not sglang_url and any(v is None for v in estimates):
        raise click.UsageError("give --sglang-url (a server to calibrate against), or both "
                               "--estimate-rps and --estimate-output-tokens")
    try:
        budget = parse_duration(time_budget)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--time-budget") from None
    options = PlanOptions(
        files=files, multi_turn=multi_turn, tools=tool_mode,
        sample_size=sample_size, seed=seed,
        costing=Costing(gpus=gpus, gpu_hour_cost=gpu_hour_cost,
                        candidates=parse_int_list(max_tokens, "--max-tokens"), seed=seed),
        sglang_url=sglang_url, time_budget_s=budget,
        levels=parse_int_list(concurrency_levels, "--concurrency-levels")
        if concurrency_levels else None,
        max_concurrency=max_concurrency, model=model, thinking=thinking,
        api_key=sglang_api_key(),
        estimate_rps=estimate_rps, estimate_output_tokens=estimate_output_tokens,
        show_progress=show_progress, scratch=settings.state_dir / "plan")
    err = Console(stderr=True)
    result = make_plan(options, err)
    encoded = msgspec.json.encode(result)
    if output is not None:
        output.write_bytes(msgspec.json.format(encoded, indent=2) + b"\n")
    if as_json:
        click.echo(encoded.decode())
    else:
        out = Console() if Console().is_terminal else Console(width=140)
        out.print(render(result))
        if output is not None:
            out.print(f"plan written to {output}: use it with "
                      f"`tokenmill produce ... --plan {output}`")
