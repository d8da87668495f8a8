"""Shared pieces of the producer tests: running the producer in-process or as
`tokenmill produce`, and reading what it wrote with kafka-python."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from io import StringIO
from pathlib import Path
from typing import Any

from rich.console import Console

from producer.pipeline import Outcome, ProduceOptions, run_producer
from schemas.progress import producer_key
from schemas.run import GenerationSettings, RunSpec, S3Destination
from tests.kafka_helpers import read_all
from tokenmill.kafka import topics
from tokenmill.registry import RunRegistry
from tokenmill.settings import Settings

REPO = Path(__file__).resolve().parents[2]


def spec_for(settings: Settings, run_id: str, *, partitions: int = 4, **fields: Any) -> RunSpec:
    """The spec the CLI builds with default flags (S3 from the settings)."""
    s3 = S3Destination(bucket=settings.s3_bucket) if settings.s3_bucket else None
    return RunSpec(run_id=run_id, partitions=partitions, s3=s3, **fields)


def produce(settings: Settings, run_id: str, files: list[Path], *, partitions: int = 4,
            generation: GenerationSettings | None = None, multi_turn: str = "last-user",
            **options: Any) -> tuple[Outcome, str]:
    """Run the producer in this process; (outcome, what it printed)."""
    buffer = StringIO()
    spec = spec_for(settings, run_id, partitions=partitions,
                    generation=generation or GenerationSettings(), multi_turn=multi_turn)
    outcome = run_producer(settings, ProduceOptions(files=tuple(files), spec=spec, **options),
                           out=Console(file=buffer, width=200), err=Console(file=StringIO()))
    return outcome, buffer.getvalue()


def cli_env(settings: Settings, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "TOKENMILL_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "TOKENMILL_STATE_DIR": str(settings.state_dir),
        "TOKENMILL_S3_BUCKET": settings.s3_bucket or "",
        "TOKENMILL_LOG_FORMAT": "json",
        "PYTHONPATH": str(REPO),
    })
    env.update(extra)
    return env


def cli_args(run_id: str, files: list[Path], *extra: str,
             kill_at: str | None = None) -> list[str]:
    """`kill_at` ("STEP:N"): die at that step of the Nth transaction (tests/faults.py)."""
    entry = ["tests.faults", "--kill-at", kill_at, "--"] if kill_at else ["tokenmill.cli"]
    return [sys.executable, "-m", *entry, "produce", *map(str, files),
            "--run", run_id, "--gpus", "1", *extra]


def run_cli(settings: Settings, run_id: str, files: list[Path], *extra: str,
            env: dict[str, str] | None = None, timeout: float = 120,
            kill_at: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli_args(run_id, files, *extra, kill_at=kill_at),
                          env=env or cli_env(settings), capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, check=False)


def prompts(settings: Settings, run_id: str, committed_only: bool = True,
            partitions: int | None = None) -> list[Any]:
    """Every record of the run's prompts topic, in (partition, offset) order.

    kafka-python sometimes gets partial metadata for a just-created topic (a
    flaky 4 of 6 partitions was seen on a fresh broker), so `read_all` is
    repeated until every partition of the run shows up."""
    if partitions is None:
        partitions = RunRegistry(settings).get(run_id).partitions
    for _ in range(10):
        records = read_all(settings.bootstrap_servers, topics.prompts_topic(run_id),
                           committed_only=committed_only, timeout_s=60)
        if len({r.partition for r in records}) >= partitions or len(records) < partitions:
            break
        PARTIAL_READS.append(run_id)
        time.sleep(0.5)  # poll of a wait loop
    return sorted(records, key=lambda r: (r.partition, r.offset))


PARTIAL_READS: list[str] = []


def values(records: list[Any]) -> list[dict[str, Any]]:
    return [json.loads(r.value) for r in records]


def checkpoint(settings: Settings, run_id: str) -> dict[str, Any] | None:
    key = producer_key(run_id).encode()
    found = [r for r in read_all(settings.bootstrap_servers, topics.progress_topic(run_id),
                                  timeout_s=60)
             if r.key == key]
    return json.loads(found[-1].value) if found else None


def assert_exactly_once(settings: Settings, run_id: str,
                        expected_total: int) -> list[dict[str, Any]]:
    """Every seq in [0, total) exactly once, every id once, and a done checkpoint."""
    records = values(prompts(settings, run_id))
    seqs = sorted(r["seq"] for r in records)
    assert seqs == list(range(expected_total))
    assert len({r["id"] for r in records}) == expected_total
    cp = checkpoint(settings, run_id)
    assert cp is not None and cp["done"] is True
    assert cp["next_seq"] == cp["total"] == expected_total
    return records
