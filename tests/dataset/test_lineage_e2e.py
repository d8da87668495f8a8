"""A lineage end to end on the real broker and S3 server: a run at a small
`--max-tokens`, a redrive of its `length` dead letters with a larger one, a
redrive of that redrive; then `dataset`, `status` and `export` checked
against what kafka-python and plain boto3 read, sharing no code with
tokenmill. Also: exporting twice gives the same bytes, a killed export and a
killed redrive resume without duplicates."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import msgspec
import pyarrow.parquet as pq
import pytest
import zstandard

from devstack.processes import free_port
from sglang_sim import SimulatorConfig
from sglang_sim.runner import SimulatorProcess
from tests.e2e.test_pipeline import Service, write_dataset
from tests.kafka_helpers import read_all
from tokenmill.settings import Settings

pytestmark = [pytest.mark.broker, pytest.mark.s3, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
ROOT, MID, LEAF = "root", "r4k", "r8k"
SHARD = 40


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "tokenmill.cli", *args]


@dataclass
class Truth:
    """What the runs wrote, read with kafka-python and boto3."""

    runs: list[str]
    prompts: list[str]  # the root's prompt ids
    accepted: dict[str, set[str]] = field(default_factory=dict)  # run -> ids in S3
    rejected: dict[str, dict[str, str]] = field(default_factory=dict)  # run -> id -> reason

    def winner(self, pid: str) -> str | None:
        won = [run for run in self.runs if pid in self.accepted[run]]
        return won[-1] if won else None

    def last_word(self, pid: str) -> tuple[str, str]:
        run = [r for r in self.runs if pid in self.rejected[r] or pid in self.accepted[r]][-1]
        return run, self.rejected[run][pid]


@dataclass
class Built:
    settings: Settings
    env: dict[str, str]
    tmp: Path
    run_ids: dict[str, str]
    truth: Truth

    def run(self, *args: str, env: dict[str, str] | None = None, timeout: float = 300,
            kill_at: str | None = None) -> subprocess.CompletedProcess[str]:
        """`kill_at` ("POINT:N"): die at that crash point (tests/faults.py)."""
        argv = cli(*args) if kill_at is None else [
            sys.executable, "-m", "tests.faults", "--kill-at", kill_at, "--", *args]
        return subprocess.run(argv, env=env or self.env, capture_output=True, text=True,
                              timeout=timeout, cwd=REPO, check=False)


def s3_lines(settings: Settings, run_id: str) -> list[dict[str, Any]]:
    s3 = boto3.client("s3", endpoint_url=settings.s3_endpoint_url, region_name="us-east-1")
    out = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=settings.s3_bucket,
                                                             Prefix=f"{run_id}/"):
        for item in page.get("Contents", []):
            body = s3.get_object(Bucket=settings.s3_bucket, Key=item["Key"])["Body"].read()
            if item["Key"].endswith(".zst"):
                body = zstandard.ZstdDecompressor().decompressobj().decompress(body)
            out += [json.loads(line) for line in body.splitlines() if line.strip()]
    return out


def dlq(settings: Settings, run_id: str) -> dict[str, str]:
    records = read_all(settings.bootstrap_servers, f"tokenmill.{run_id}.dlq", timeout_s=60)
    found = {r.key.decode(): dict(r.headers)["tokenmill.dlq.reason"].decode() for r in records}
    assert len(found) == len(records), "a prompt in the DLQ twice"
    return found


def prompt_ids(settings: Settings, run_id: str) -> list[str]:
    return [r.key.decode() for r in read_all(settings.bootstrap_servers,
                                              f"tokenmill.{run_id}.prompts", timeout_s=60)]


def generate(env: dict[str, str], tmp: Path, run_id: str, url: str) -> None:
    """One worker and one sink until every prompt of the run is persisted."""
    worker = Service(f"consume-{run_id}", cli(
        "consume", "--run", run_id, "--sglang-url", url, "--instance", f"c-{run_id}",
        "--until-done", "--concurrency", "32", "--commit-interval", "0.3",
        "--session-timeout", "6"), env, tmp)
    sink = Service(f"sink-{run_id}", cli(
        "sink", "--run", run_id, "--instance", f"s-{run_id}", "--until-done",
        "--batch-size", "25", "--max-batch-age", "0.2", "--session-timeout", "6"), env, tmp)
    try:
        worker.start()
        sink.start()
        assert worker.wait(300) == 0, worker.tail()
        assert sink.wait(300) == 0, sink.tail()
    finally:
        worker.stop()
        sink.stop()


@pytest.fixture(scope="module")
def built(services: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("lineage")
    tag = os.urandom(4).hex()
    ids = {name: f"{name}-{tag}" for name in (ROOT, MID, LEAF)}
    settings = Settings(bootstrap_servers=services.bootstrap_servers,
                        s3_endpoint_url=services.s3_endpoint_url, s3_bucket=f"tm-lineage-{tag}",
                        state_dir=tmp / "state", connect_timeout_s=10.0)
    aws = {"AWS_ACCESS_KEY_ID": services.s3_access_key,
           "AWS_SECRET_ACCESS_KEY": services.s3_secret_key, "AWS_DEFAULT_REGION": "us-east-1"}
    saved = {k: os.environ.get(k) for k in aws}
    os.environ.update(aws)
    env = {**os.environ, "TOKENMILL_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
           "TOKENMILL_S3_ENDPOINT_URL": services.s3_endpoint_url,
           "TOKENMILL_S3_BUCKET": settings.s3_bucket or "", "TOKENMILL_LOG_FORMAT": "json",
           "TOKENMILL_STATE_DIR": str(settings.state_dir), "PYTHONPATH": str(REPO),
           "PYTHONUNBUFFERED": "1"}
    boto3.client("s3", endpoint_url=services.s3_endpoint_url,
                 region_name="us-east-1").create_bucket(Bucket=settings.s3_bucket)
    b = Built(settings, env, tmp, ids, Truth(runs=[ids[ROOT], ids[MID], ids[LEAF]], prompts=[]))
    files = write_dataset(tmp, 200)
    produced = b.run("produce", *map(str, files), "--run", ids[ROOT], "--gpus", "2",
                     "--partitions-per-gpu", "2", "--max-tokens", "2048", "--model", "sim/Qwen3",
                     "--no-progress")
    assert produced.returncode == 0, produced.stderr[-3000:]
    # Lengths are a function of the prompt: a prompt cut at 2048 is long, and
    # some are cut again at 4096; 3% answers are empty (never redriven).
    sim = SimulatorProcess(SimulatorConfig(zero_delay=True, empty_rate=0.03,
                                           tool_call_parser="qwen25", model_path="sim/Qwen3",
                                           speculative_accept_length=2.5),
                           port=free_port())
    url = sim.start()
    try:
        generate(env, tmp, ids[ROOT], url)
        for parent, child, max_tokens in ((ROOT, MID, "4096"), (MID, LEAF, "8192")):
            redriven = b.run("runs", "redrive", ids[child], "--parent", ids[parent],
                             "--reasons", "length", "--max-tokens", max_tokens, "--no-progress")
            assert redriven.returncode == 0, redriven.stderr[-3000:]
            generate(env, tmp, ids[child], url)
    finally:
        sim.terminate()
    truth = b.truth
    truth.prompts = prompt_ids(settings, ids[ROOT])
    for run in truth.runs:
        lines = s3_lines(settings, run)
        truth.accepted[run] = {line["id"] for line in lines}
        assert len(truth.accepted[run]) == len(lines)
        truth.rejected[run] = dlq(settings, run)
    yield b
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def test_each_redrive_holds_exactly_its_parents_dead_letters(built: Built) -> None:
    t = built.truth
    root, mid, leaf = t.runs
    assert len(t.prompts) == len(set(t.prompts)) == 300
    for parent, child in ((root, mid), (mid, leaf)):
        wanted = {pid for pid, reason in t.rejected[parent].items() if reason == "length"}
        published = prompt_ids(built.settings, child)
        assert len(published) == len(set(published)), "a redrive published a prompt twice"
        assert set(published) == wanted and wanted
    # The lineage is worth testing: each redrive rescued some, some stay cut.
    assert t.accepted[mid] and t.accepted[leaf]
    assert any(reason == "empty" for reason in t.rejected[root].values())
    spec = json.loads(built.run("runs", "show", built.run_ids[LEAF]).stdout)
    assert spec["parent_run"] == mid
    assert spec["origin"] == {"kind": "redrive", "reasons": ["length"]}
    assert spec["generation"]["max_tokens"] == 8192


def test_dataset_counts_match_what_the_runs_wrote(built: Built) -> None:
    t = built.truth
    result = built.run("dataset", built.run_ids[LEAF], "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    winners = Counter(t.winner(pid) for pid in t.prompts)
    assert [(p["run"], p["results"]) for p in report["parts"]] == \
           [(run, winners[run]) for run in t.runs]
    assert report["exact"] and report["complete"]
    assert report["with_result"] == len(t.prompts) - winners[None]
    without = Counter(t.last_word(pid) for pid in t.prompts if t.winner(pid) is None)
    assert {(w["run"], w["reason"]): w["prompts"] for w in report["without_result"]} == without
    assert [p["generation"]["max_tokens"] for p in report["parts"]] == [2048, 4096, 8192]
    assert report["anomalies"] == {}
    # The same lineage, asked from its root; and as the table an operator reads.
    from_root = json.loads(built.run("dataset", built.run_ids[ROOT], "--json").stdout)
    assert from_root["parts"] == report["parts"]
    shown = " ".join(built.run("dataset", built.run_ids[ROOT]).stdout.split())
    assert f"{report['with_result']:,} of 300 prompts have an accepted result" in shown
    assert "empty" in shown and "length" in shown


def test_status_shows_the_lineage_coverage(built: Built) -> None:
    t = built.truth
    result = built.run("status", "--run", built.run_ids[ROOT], "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    lineage = json.loads(result.stdout)["lineage"]
    covered = sum(t.winner(pid) is not None for pid in t.prompts)
    assert lineage["with_result"] == lineage["with_result_at_most"] == covered
    assert lineage["prompts"] == 300 and lineage["runs"] == t.runs
    shown = built.run("status", "--run", built.run_ids[MID])
    assert f"{covered:,} of 300 prompts have an accepted result" in " ".join(shown.stdout.split())


def read_export(directory: Path, fmt: str) -> list[dict[str, Any]]:
    manifest = json.loads((directory / "manifest.json").read_text())
    rows: list[dict[str, Any]] = []
    for shard in manifest["shards"]:
        data = (directory / shard["name"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == shard["sha256"]
        assert len(data) == shard["bytes"]
        if fmt == "parquet":
            found = pq.read_table(io.BytesIO(data)).to_pylist()
        else:
            found = [json.loads(line) for line in data.decode().splitlines()]
        assert len(found) == shard["records"]
        rows += found
    return rows


@pytest.mark.parametrize("fmt", ["openai", "sharegpt", "specforge", "parquet"])
def test_export_holds_every_prompt_once_from_the_newest_run(built: Built, fmt: str) -> None:
    t = built.truth
    out = built.tmp / f"export-{fmt}"
    result = built.run("export", built.run_ids[LEAF], "--format", fmt, "--out", str(out),
                       "--shard-records", str(SHARD), "--no-progress")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_export(out, fmt)
    ids = [row["id"] for row in rows]
    assert len(ids) == len(set(ids)), "a prompt exported twice"
    expected = {pid: t.winner(pid) for pid in t.prompts if t.winner(pid) is not None}
    assert set(ids) == set(expected)
    if fmt in ("openai", "parquet"):
        assert all(row["run"] == expected[row["id"]] for row in rows)
    card = (out / "README.md").read_text()
    assert "sim/Qwen3" in card and "| 2048 |" in card and "| 8192 |" in card
    assert f"samples: {len(expected):,} of 300 prompts" in card
    assert "accept length (weighted by completion tokens): 2." in card
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and manifest["plan"]["records"] == len(expected)
    assert len(manifest["shards"]) == -(-len(expected) // SHARD)
    figures = json.loads((out / "report.json").read_text())  # `tokenmill report`, beside the card
    assert (figures["records"], figures["accepted"]) == (300, len(expected))
    assert "<svg" in (out / "report.html").read_text()


def files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_exporting_twice_gives_identical_bytes_locally_and_on_s3(built: Built) -> None:
    first, second = built.tmp / "twice-a", built.tmp / "twice-b"
    for out in (first, second, f"s3://{built.settings.s3_bucket}/exports/twice"):
        result = built.run("export", built.run_ids[ROOT], "--format", "specforge", "--out",
                           str(out), "--shard-records", str(SHARD), "--no-progress")
        assert result.returncode == 0, result.stderr[-3000:]
    assert files(first) == files(second)
    s3 = boto3.client("s3", endpoint_url=built.settings.s3_endpoint_url, region_name="us-east-1")
    listed = s3.list_objects_v2(Bucket=built.settings.s3_bucket, Prefix="exports/twice/")
    on_s3 = {item["Key"].rsplit("/", 1)[1]: s3.get_object(
        Bucket=built.settings.s3_bucket, Key=item["Key"])["Body"].read()
        for item in listed["Contents"]}
    assert on_s3 == files(first)
    again = built.run("export", built.run_ids[ROOT], "--format", "specforge", "--out",
                      str(first), "--shard-records", str(SHARD))
    assert again.returncode == 0 and "already exported" in again.stdout


def test_a_killed_export_resumes_without_duplicates(built: Built) -> None:
    clean, killed = built.tmp / "resume-clean", built.tmp / "resume-killed"
    args = ("export", built.run_ids[LEAF], "--format", "parquet", "--shard-records", str(SHARD),
            "--no-progress")
    assert built.run(*args, "--out", str(clean)).returncode == 0
    # Dies with the third shard in place but not recorded.
    crashed = built.run(*args, "--out", str(killed), kill_at="export.shard_written:3")
    assert crashed.returncode == 137, crashed.stderr[-2000:]
    progress = json.loads((killed / "_export_progress.json").read_text())
    assert len(progress["shards"]) == 2
    assert not (killed / "manifest.json").exists()
    resumed = built.run(*args, "--out", str(killed))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed after 2 shard(s)" in resumed.stdout
    assert files(killed) == files(clean)
    ids = [row["id"] for row in read_export(killed, "parquet")]
    assert len(ids) == len(set(ids))


def test_a_redrive_killed_mid_publish_publishes_each_prompt_once(built: Built) -> None:
    t = built.truth
    child = f"{built.run_ids[ROOT]}-again"
    args = ("runs", "redrive", child, "--parent", built.run_ids[ROOT], "--reasons",
            "length,empty", "--max-tokens", "16384", "--transaction-records", "10",
            "--no-progress")
    # Dies as its fourth transaction commits, its records on the broker.
    crashed = built.run(*args, kill_at="transaction.committing:4")
    assert crashed.returncode == 137, crashed.stderr[-2000:]
    assert len(prompt_ids(built.settings, child)) == 30  # three transactions committed
    resumed = built.run(*args)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming run" in resumed.stdout and "30 of" in resumed.stdout
    published = prompt_ids(built.settings, child)
    wanted = {pid for pid, r in t.rejected[built.run_ids[ROOT]].items() if r in ("length", "empty")}
    assert len(published) == len(set(published)) == len(wanted)
    assert set(published) == wanted
    again = built.run(*args)
    assert again.returncode == 0 and "nothing to publish (0 published)" in again.stdout
    assert len(prompt_ids(built.settings, child)) == len(wanted)
    # A redrive of a run that is not finished is refused: the redrive just made.
    refused = built.run("runs", "redrive", f"{child}-b", "--parent", child, "--reasons", "length")
    assert refused.returncode == 1 and "not finished" in refused.stderr
    spec = msgspec.json.decode(built.run("runs", "show", child).stdout)
    assert spec["origin"] == {"kind": "redrive", "reasons": ["empty", "length"]}
