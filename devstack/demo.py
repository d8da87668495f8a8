"""`tokenmill demo`: the whole job on the embedded default, on one machine.

Brings up a Kafka broker and an S3 server (the dev stack, on free ports in a
state directory of its own), a few simulated GPUs, publishes the bundled
sample dataset, runs one consumer per simulated GPU and the sink until every
prompt is persisted, prints the summary, and stops everything it started.
Every service runs as the same `tokenmill` command a user would run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import boto3
import click
from rich.console import Console
from rich.table import Table

from devstack import processes, stack
from sglang_sim import SimulatorConfig
from sglang_sim.runner import SimulatorProcess
from tokenmill.commandline import register_known_error, service_command
from tokenmill.flag_types import RUN_ID, seconds
from tokenmill.progress import read_run_progress
from tokenmill.settings import Settings, writable_state_dir

register_known_error(*stack.SETUP_ERRORS)

SAMPLE_DIR = Path(__file__).parent / "sample"

console = Console(stderr=True)


def sample_files() -> list[Path]:
    files = sorted(p for p in SAMPLE_DIR.iterdir()
                   if p.suffix in (".jsonl", ".json", ".gz", ".zst", ".parquet"))
    if not files:
        raise click.ClickException(f"no sample dataset in {SAMPLE_DIR}")
    return files


class Child:
    """A `tokenmill` subcommand as a child process with its own log file."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], logs: Path) -> None:
        self.name = name
        self.log_path = logs / f"{name}.log"
        with open(self.log_path, "ab") as log_file:
            self.proc = subprocess.Popen([sys.executable, "-m", "tokenmill.cli", *args],
                                         stdout=log_file, stderr=subprocess.STDOUT, env=env)

    def poll(self) -> int | None:
        return self.proc.poll()

    def stop(self, timeout: float = 60) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def _simulator_config(seed: int) -> SimulatorConfig:
    # A fast GPU with the seed run's shape: thinking answers of ~2,400 tokens
    # (some cut at max_tokens), tool calls, speculative decoding, and a few
    # faults so the DLQ and retries have something to show.
    return SimulatorConfig(
        seed=seed, tool_call_parser="qwen25", enable_cache_report=True,
        speculative_accept_length=3.1, max_running_requests=32, decode_rate=80.0,
        max_total_tok_s=2500.0, prefill_rate=0, time_scale=400.0,
        error_rate=0.02, empty_rate=0.01, trivial_rate=0.01,
    )


@click.command()
@click.option("--gpus", default=2, show_default=True, type=click.IntRange(1, 16),
              help="Simulated GPUs (one simulator and one consumer each).")
@click.option("--run", "run_id", default=None, type=RUN_ID,
              help="Run id (default: demo-<time>).")
@click.option("--max-tokens", default=4096, show_default=True, type=click.IntRange(min=1))
@click.option("--timeout", "timeout_s", default=600.0, show_default=True,
              type=seconds(0, 7 * 86400),
              help="Give up after this many seconds.")
@click.option("--keep", is_flag=True, help="Leave the stack running afterwards.")
@service_command
def demo(settings: Settings, gpus: int, run_id: str | None, max_tokens: int, timeout_s: float,
         keep: bool) -> None:
    """Run the whole pipeline on bundled sample data with simulated GPUs.

    \b
    Example:
      tokenmill demo
    """
    run_id = run_id or time.strftime("demo-%Y%m%d-%H%M%S")
    state_dir = writable_state_dir(settings, "demo")
    logs = state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    plan = stack.StackPlan.on_free_ports(state_dir / "stack", kafka_heap="768m",
                                         quick_jvm=True)
    with console.status("starting Kafka and S3...") as spinner:
        stack_state, _ = stack.up(plan, on_progress=spinner.update)
    env = {**os.environ, **stack_state.env(), "TOKENMILL_LOG_FORMAT": "json",
           "TOKENMILL_STATE_DIR": str(state_dir)}
    for key, value in stack_state.env().items():
        os.environ[key] = value
    run_settings = Settings(bootstrap_servers=stack_state.bootstrap,
                            s3_endpoint_url=stack_state.s3.address, s3_bucket=stack_state.bucket,
                            state_dir=state_dir)
    console.print(f"[green]stack up[/]: Kafka {stack_state.bootstrap}, "
                  f"S3 {stack_state.s3.address}; logs in {logs}")
    sims: list[SimulatorProcess] = []
    children: list[Child] = []
    ok = False
    try:
        for gpu in range(gpus):
            sim = SimulatorProcess(_simulator_config(gpu), port=processes.free_port())
            sim.start()
            sims.append(sim)
        console.print(f"[green]{gpus} simulated GPU(s)[/]: "
                      + ", ".join(sim.base_url for sim in sims))

        files = [str(p) for p in sample_files()]
        produce = subprocess.run(
            [sys.executable, "-m", "tokenmill.cli", "produce", *files, "--run", run_id,
             "--gpus", str(gpus), "--model", "Qwen/Qwen3-8B", "--max-tokens", str(max_tokens),
             "--estimate-rps", str(8.0 * gpus), "--estimate-output-tokens", "2400",
             "--no-progress"],
            env=env, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        if produce.returncode != 0:
            raise click.ClickException(f"produce failed:\n{produce.stderr[-3000:]}")
        console.print(produce.stdout.strip() or produce.stderr.strip()[-3000:])

        for gpu, sim in enumerate(sims):
            children.append(Child(f"consume-gpu{gpu}", [
                "consume", "--run", run_id, "--sglang-url", sim.base_url,
                "--instance", f"demo-gpu{gpu}", "--until-done", "--commit-interval", "1",
                "--retry-base", "0.2"], env, logs))
        children.append(Child("sink", ["sink", "--run", run_id, "--instance", "demo-sink",
                                       "--until-done", "--max-batch-age", "2"], env, logs))
        ok = _wait(run_settings, run_id, children, timeout_s)
        if ok:
            output = state_dir / "output" / run_id
            summary = _status(run_id, env)
            saved = _save_output(run_settings, run_id, stack_state, output)
            _report_page(run_id, env, output / "report")
    finally:
        for child in children:
            child.stop()
        for sim in sims:
            sim.terminate()
        if not keep:
            stack.down(plan.state_dir)
    if not ok:
        raise click.ClickException(f"the demo did not finish; logs in {logs}")
    _report(summary, saved, output, time.monotonic() - started, keep, stack_state)


def _status(run_id: str, env: dict[str, str]) -> dict[str, Any]:
    """The run's numbers as `tokenmill status --json` gives them (schema:
    `tokenmill status --json-schema`), from the command a user would run."""
    result = subprocess.run([sys.executable, "-m", "tokenmill.cli", "status", "--run", run_id,
                             "--json"], env=env, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise click.ClickException(f"status failed:\n{result.stderr[-3000:]}")
    found: dict[str, Any] = json.loads(result.stdout)
    return found


def _report_page(run_id: str, env: dict[str, str], out: Path) -> None:
    """The run's charts (`tokenmill report`, the command a user would run),
    kept with the output after the stack goes away."""
    result = subprocess.run([sys.executable, "-m", "tokenmill.cli", "report", run_id, "--out",
                             str(out)], env=env, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise click.ClickException(f"report failed:\n{result.stderr[-3000:]}")


def _wait(settings: Settings, run_id: str, children: list[Child], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    with console.status("generating...") as spinner:
        while time.monotonic() < deadline:
            codes = [child.poll() for child in children]
            failed = [c for c, code in zip(children, codes) if code not in (None, 0)]
            if failed:
                for child in failed:
                    console.print(
                        f"[red]{child.name} exited with {child.poll()}[/]\n{child.tail()}")
                return False
            if all(code == 0 for code in codes):
                return True
            state = read_run_progress(settings, run_id)
            spinner.update(f"published {state.published:,}  generated {state.generated:,}  "
                           f"persisted {state.persisted:,}")
            time.sleep(1.0)
    console.print("[red]timed out[/]")
    return False


def _save_output(settings: Settings, run_id: str, stack_state: stack.StackState,
                 output: Path) -> dict[str, int]:
    """Copy the run's S3 objects and DLQ records out of the demo stack, which
    goes away at the end, so the results stay to be read."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    from tokenmill.kafka import topics
    from tokenmill.kafka.committed import value_of

    output.mkdir(parents=True, exist_ok=True)
    s3 = boto3.client("s3", endpoint_url=stack_state.s3.address, region_name="us-east-1")
    objects = 0
    lines = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=stack_state.bucket,
                                                             Prefix=f"{run_id}/"):
        for item in page.get("Contents", []):
            target = output / "s3" / item["Key"]
            target.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(stack_state.bucket, item["Key"], str(target))
            objects += 1
            if target.suffix == ".jsonl":
                lines += sum(1 for _ in target.open("rb"))
    consumer = Consumer({"bootstrap.servers": settings.bootstrap_servers,
                         "group.id": "tokenmill-demo-export", "enable.partition.eof": True,
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    topic = topics.dlq_topic(run_id)
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    remaining = set(partitions)
    dlq = 0
    with open(output / "dlq.jsonl", "wb") as dlq_file:
        while remaining:
            for message in consumer.consume(500, timeout=1.0):
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        remaining.discard(message.partition())
                    continue
                dlq_file.write(value_of(message) + b"\n")
                dlq += 1
    consumer.close()
    return {"objects": objects, "lines": lines, "dlq": dlq}


def _report(s: dict[str, Any], saved: dict[str, int], output: Path, elapsed: float, keep: bool,
            stack_state: stack.StackState) -> None:
    table = Table(title=f"tokenmill demo: run {s['run']}")
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("prompts published", f"{s['published']:,}")
    table.add_row("completions generated", f"{s['completions']:,}")
    table.add_row("failures (after retries)", f"{s['failures']:,}")
    for reason, count in sorted(s["finish_reasons"].items()):
        table.add_row(f"  finish_reason {reason}", f"{count:,}")
    table.add_row("in S3 (lines)", f"{s['s3_records']:,}")
    table.add_row("S3 objects / bytes", f"{s['s3_objects']:,} / {s['s3_bytes']:,}")
    table.add_row("in the DLQ", f"{s['dlq_records']:,}")
    for reason, count in sorted(s["dlq_by_reason"].items()):
        table.add_row(f"  DLQ {reason}", f"{count:,}")
    lost = s["published"] - s["s3_records"] - s["dlq_records"]
    table.add_row("lost or duplicated", f"{lost:,}" if lost else "0 (S3 + DLQ = published)")
    table.add_row("output tokens", f"{s['completion_tokens']:,}")
    table.add_row("throughput", f"{s['requests_per_s']:.1f} req/s, {s['tokens_per_s']:,.0f} tok/s")
    accept = s["accept_length"]
    table.add_row("speculative accept length", f"{accept:.2f}" if accept else "-")
    for category, count in sorted(s["generated_by_category"].items()):
        table.add_row(f"  generated: {category}", f"{count:,}")
    table.add_row("wall time", f"{elapsed:.0f}s")
    Console().print(table)
    where = (f"S3 s3://{stack_state.bucket}/{s['run']}/ at {stack_state.s3.address} (kept running)"
             if keep else f"{output}/s3 ({saved['objects']} objects, {saved['lines']} lines)")
    console.print(f"output: {where}; DLQ records: {output / 'dlq.jsonl'} ({saved['dlq']}); "
                  f"charts: {output / 'report' / 'report.html'}")
