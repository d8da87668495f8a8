"""`tokenmill produce`: flags -> a run spec and options; the work is in
producer/pipeline.py."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import click
import msgspec
from rich.console import Console

from producer.errors import ProducerError
from producer.inputs import resolve as resolve_inputs
from producer.pipeline import ProduceOptions, run_producer
from schemas.plan import Plan, plan_decoder
from schemas.run import (
    DLQ_REASONS,
    Compression,
    Estimate,
    GenerationSettings,
    MultiTurnPolicy,
    QAPolicy,
    RunSpec,
    S3Destination,
    ToolMode,
)
from tokenmill.commandline import register_known_error, service_command
from tokenmill.flag_types import RUN_ID, FiniteFloat, TopK
from tokenmill.forecast.estimate import PlanMismatch, input_differences, run_estimate
from tokenmill.forecast.table import forecast
from tokenmill.kafka.clients import wait_for_broker
from tokenmill.settings import Settings, writable_state_dir
from tokenmill.tool_results import HookUnavailable, load_hook

DEFAULT_GPU_HOUR_COST = 4.5

register_known_error(ProducerError, HookUnavailable)


def parse_dlq_reasons(value: str | None) -> QAPolicy:
    if value is None:
        return QAPolicy()
    reasons = tuple(r.strip() for r in value.split(",") if r.strip())
    try:
        return QAPolicy(dlq_reasons=reasons)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--dlq-reasons") from None


@click.command("produce")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--run", "run_id", required=True, type=RUN_ID,
              help="Run id (letters, digits, '_', '-').")
@click.option("--gpus", type=click.IntRange(min=1), required=True,
              help="GPUs (consumers) the run is sized for.")
@click.option("--partitions-per-gpu", type=click.IntRange(min=1), default=4, show_default=True,
              help="Partitions per GPU: headroom to add or move consumers.")
@click.option("--multi-turn", type=click.Choice(list(get_args(MultiTurnPolicy))),
              default="last-user", show_default=True,
              help="What a conversation becomes (regenerate-turns: the model answers every "
                   "user turn in order, continuing through tool calls).")
@click.option("--tool-results", "tool_results", default=None, metavar="MODULE:FUNCTION",
              help="regenerate-turns: a function answering generated tool calls before the "
                   "dataset's recorded results (stored in the run spec).")
@click.option("--tools", "tool_mode", type=click.Choice(["structured", "as-given"]),
              default="structured", show_default=True,
              help="Tool specs as the request's `tools` field, or left in the system prompt.")
@click.option("--model", default="default", show_default=True, help="Model name for requests.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=8192, show_default=True)
@click.option("--temperature", type=FiniteFloat(min=0.0), default=0.6, show_default=True)
@click.option("--top-p", type=FiniteFloat(min=0.0, max=1.0, min_open=True), default=0.95,
              show_default=True)
@click.option("--top-k", type=TopK(), default=20, show_default=True, help="-1: off.")
@click.option("--seed", type=int, default=None, help="Sampling seed (unset: none).")
@click.option("--thinking/--no-thinking", default=True, show_default=True,
              help="Ask for the model's reasoning (enable_thinking).")
@click.option("--estimate-rps", type=FiniteFloat(min=0.0, min_open=True), default=None,
              help="Expected requests/s, to compare progress against.")
@click.option("--estimate-output-tokens", type=FiniteFloat(min=0.0, min_open=True),
              default=None, help="Expected output tokens per completion.")
@click.option("--plan", "plan_path", type=click.Path(path_type=Path), default=None,
              help="A `tokenmill plan` JSON file: its prediction for this run's max_tokens "
                   "and GPUs becomes the estimate (instead of --estimate-*).")
@click.option("--gpu-hour-cost", type=click.FloatRange(min=0.0), default=None,
              help=f"Price of a GPU-hour for the forecast [default: the plan's, else "
                   f"{DEFAULT_GPU_HOUR_COST}].")
@click.option("--dlq-reasons", default=None,
              help=f"Comma list of outcomes sent to the DLQ [default: all of "
                   f"{','.join(sorted(DLQ_REASONS))}].")
@click.option("--parent-run", type=RUN_ID, default=None, help="Run this one replays or extends.")
@click.option("--s3-compression", type=click.Choice(["none", "zstd"]), default="none",
              show_default=True, help="Compression of the S3 objects the sink writes.")
@click.option("--rejects", "rejects_path", type=click.Path(dir_okay=False, path_type=Path),
              default=None,
              help="Rejected records (JSONL) [default: <state-dir>/producer/<run>/rejects.jsonl].")
@click.option("--strict", is_flag=True, help="Stop at the first rejected record (exit 1).")
@click.option("--dry-run", is_flag=True,
              help="Read and summarize only: no run is created, nothing is published.")
@click.option("--transaction-records", type=click.IntRange(min=1), default=20_000,
              show_default=True, help="Prompts per Kafka transaction at most.")
@click.option("--progress/--no-progress", "show_progress", default=None,
              help="Progress bars on stderr [default: when stderr is a terminal].")
@service_command
def produce(settings: Settings, files: tuple[Path, ...], run_id: str, gpus: int,
            partitions_per_gpu: int, multi_turn: MultiTurnPolicy, tool_mode: ToolMode, model: str,
            max_tokens: int, temperature: float, top_p: float, top_k: int, seed: int | None,
            thinking: bool, estimate_rps: float | None, estimate_output_tokens: float | None,
            plan_path: Path | None, gpu_hour_cost: float | None, dlq_reasons: str | None,
            parent_run: str | None, s3_compression: Compression, tool_results: str | None,
            rejects_path: Path | None, strict: bool, dry_run: bool, transaction_records: int,
            show_progress: bool | None) -> None:
    """Normalize prompt files and publish them to a new run, exactly once.

    Reads JSONL, JSON arrays, .gz/.zst JSONL and Parquet; detects ShareGPT,
    OpenAI messages and request bodies, Hermes and "Available tools:" function
    calling, Alpaca and plain prompts, per record. Running the same command
    again resumes after the last committed transaction; after completion it
    publishes nothing.

    \b
    Examples:
      tokenmill produce data/*.jsonl --run qwen-r1 --gpus 7
      tokenmill produce chats.json.gz tools.parquet --run r2 --gpus 8 \\
          --multi-turn per-user-turn --max-tokens 16384 --dry-run
    """
    generation = GenerationSettings(model=model, max_tokens=max_tokens, temperature=temperature,
                                    top_p=top_p, top_k=top_k, seed=seed,
                                    enable_thinking=thinking, tools=tool_mode)
    s3 = (S3Destination(bucket=settings.s3_bucket, prefix=settings.s3_prefix,
                        compression=s3_compression)
          if settings.s3_bucket else None)
    estimate = (Estimate(requests_per_s=estimate_rps, output_tokens=estimate_output_tokens)
                if estimate_rps is not None or estimate_output_tokens is not None else None)
    err = Console(stderr=True)
    price = DEFAULT_GPU_HOUR_COST if gpu_hour_cost is None else gpu_hour_cost
    if plan_path is not None:
        if estimate is not None:
            raise click.UsageError("give --plan or --estimate-rps/--estimate-output-tokens, "
                                   "not both")
        plan = load_plan(plan_path)
        price = plan.assumptions.gpu_hour_cost if gpu_hour_cost is None else gpu_hour_cost
        for warning in input_differences(plan, files, multi_turn, tool_mode):
            err.print(f"[yellow]warning: {warning}[/]")
        try:
            estimate = run_estimate(plan, max_tokens=max_tokens, gpus=gpus, gpu_hour_cost=price)
        except PlanMismatch as exc:
            raise click.BadParameter(f"{plan_path}: {exc}", param_hint="--plan") from None
    spec = RunSpec(run_id=run_id, partitions=gpus * partitions_per_gpu, gpus=gpus,
                   generation=generation,
                   multi_turn=multi_turn,
                   qa=parse_dlq_reasons(dlq_reasons), s3=s3, parent_run=parent_run,
                   estimate=estimate, tool_results=tool_results)
    if tool_results is not None and multi_turn != "regenerate-turns":
        raise click.UsageError("--tool-results answers the tool calls of --multi-turn "
                               "regenerate-turns runs only")
    if tool_results is not None:
        load_hook(tool_results)  # a typo fails here, not on every worker later
    writable_state_dir(settings, "producer", run_id)
    resolve_inputs(list(files))  # a missing file fails before any wait
    if not dry_run:
        wait_for_broker(settings)
    out = Console() if Console().is_terminal else Console(width=160)
    outcome = run_producer(settings, ProduceOptions(
        files=files, spec=spec, rejects_path=rejects_path, strict=strict, dry_run=dry_run,
        transaction_records=transaction_records, show_progress=show_progress), out=out, err=err)
    if spec.estimate is not None and outcome.total:
        out.print(forecast(spec.estimate, prompts=outcome.total, gpus=gpus, gpu_hour_cost=price,
                           max_tokens=max_tokens))


def load_plan(path: Path) -> Plan:
    try:
        return plan_decoder.decode(path.read_bytes())
    except OSError as exc:
        raise click.BadParameter(f"{path}: {exc.strerror or exc}", param_hint="--plan") from None
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise click.BadParameter(f"{path}: not a tokenmill plan ({exc})",
                                 param_hint="--plan") from None
