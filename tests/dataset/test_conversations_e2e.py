"""Conversations end to end on the real broker and S3 server: a
`regenerate-turns` run (multi-turn chats, and chats whose tool calls are
spliced in or left unresolved) at a small `--max-tokens`, so some
conversations are dead-lettered `length` part-way; a redrive of those
`--from-failed-turn` with a larger one; then the lineage exported in every
format and checked against what kafka-python, boto3 and the simulator's
request logs say, sharing no code with tokenmill:

- the redrive requested no step a conversation had finished: each resumed
  conversation's first request is the step that was cut, carrying exactly
  the turns the parent generated;
- the export holds each conversation once, from the newest run that
  finished it; every assistant message of every row is the stored generated
  step (none is dataset text), its reasoning in the format's field;
- SpecForge's loader and the Qwen3 template read the specforge rows back
  into the stored turns; pyarrow reads the parquet;
- `tool_unresolved` conversations are left out, or cut after their last
  complete turn with `--include-partial`, and counted either way.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest

from devstack.processes import free_port
from sglang_sim import SimulatorConfig
from sglang_sim.runner import SimulatorProcess
from tests.dataset.test_conversation_formats import (
    assistant_blocks,
    load_like_specforge,
    qwen3_render,
)
from tests.dataset.test_lineage_e2e import (
    REPO,
    Built,
    cli,
    generate,
    prompt_ids,
    read_export,
    s3_lines,
)
from tests.e2e.test_regenerate_tools import write_tool_chats
from tests.e2e.test_regenerate_turns import write_conversations
from tests.kafka_helpers import read_all
from tokenmill.settings import Settings

pytestmark = [pytest.mark.broker, pytest.mark.s3, pytest.mark.slow]

ROOT, CHILD = "chats", "chats-8k"
FORMATS = ("openai", "sharegpt", "specforge", "parquet")


@dataclass
class Runs:
    """What the two runs wrote, read with kafka-python, boto3 and the logs."""

    built: Built
    prompts: list[str] = field(default_factory=list)
    lines: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)  # run -> id -> line
    dead: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)  # run -> id -> letter
    requests: dict[str, dict[tuple[str, int], list[Any]]] = field(default_factory=dict)

    def winner(self, pid: str) -> dict[str, Any] | None:
        for run in (CHILD, ROOT):
            line = self.lines[self.built.run_ids[run]].get(pid)
            if line is not None:
                return line
        return None


def requests_by_step(log: Path) -> dict[tuple[str, int], list[Any]]:
    """(conversation id, step) -> the messages of every request logged for it."""
    out: dict[tuple[str, int], list[Any]] = defaultdict(list)
    for line in log.read_text().splitlines():
        entry = json.loads(line)
        conversation, _, step = entry["rid"].split(".")[0].rpartition("-s")
        out[(conversation, int(step))].append(entry["messages"])
    return out


def dead_letters(settings: Settings, run_id: str) -> dict[str, dict[str, Any]]:
    out = {}
    for r in read_all(settings.bootstrap_servers, f"tokenmill.{run_id}.dlq", timeout_s=60):
        headers = dict(r.headers)
        out[r.key.decode()] = {"reason": headers["tokenmill.dlq.reason"].decode(),
                               "detail": headers["tokenmill.dlq.detail"].decode(),
                               "record": json.loads(r.value)["record"]}
    return out


@pytest.fixture(scope="module")
def runs(services: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("conversations")
    tag = os.urandom(4).hex()
    ids = {name: f"{name}-{tag}" for name in (ROOT, CHILD)}
    settings = Settings(bootstrap_servers=services.bootstrap_servers,
                        s3_endpoint_url=services.s3_endpoint_url, s3_bucket=f"tm-conv-{tag}",
                        state_dir=tmp / "state", connect_timeout_s=10.0)
    env = {**os.environ, "TOKENMILL_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
           "TOKENMILL_S3_ENDPOINT_URL": services.s3_endpoint_url,
           "TOKENMILL_S3_BUCKET": settings.s3_bucket or "", "TOKENMILL_LOG_FORMAT": "json",
           "TOKENMILL_STATE_DIR": str(settings.state_dir), "PYTHONPATH": str(REPO),
           "PYTHONUNBUFFERED": "1", "AWS_ACCESS_KEY_ID": services.s3_access_key,
           "AWS_SECRET_ACCESS_KEY": services.s3_secret_key, "AWS_DEFAULT_REGION": "us-east-1"}
    boto3.client("s3", endpoint_url=services.s3_endpoint_url, region_name="us-east-1",
                 aws_access_key_id=services.s3_access_key,
                 aws_secret_access_key=services.s3_secret_key).create_bucket(
        Bucket=settings.s3_bucket)
    built = Built(settings, env, tmp, ids, truth=None)  # type: ignore[arg-type]
    chats, tools = tmp / "chats.jsonl", tmp / "tools.jsonl"
    write_conversations(chats, 60)
    write_tool_chats(tools, 30)
    produced = built.run("produce", str(chats), str(tools), "--run", ids[ROOT], "--gpus", "1",
                         "--partitions-per-gpu", "2", "--max-tokens", "1024",
                         "--multi-turn", "regenerate-turns", "--model", "sim/Qwen3",
                         "--no-progress")
    assert produced.returncode == 0, produced.stderr[-3000:]
    r = Runs(built)
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    os.environ.update(AWS_ACCESS_KEY_ID=services.s3_access_key,
                      AWS_SECRET_ACCESS_KEY=services.s3_secret_key)
    for name in (ROOT, CHILD):
        if name == CHILD:
            redriven = built.run("runs", "redrive", ids[CHILD], "--parent", ids[ROOT],
                                 "--reasons", "length", "--max-tokens", "8192",
                                 "--from-failed-turn", "--no-progress")
            assert redriven.returncode == 0, redriven.stderr[-3000:]
            assert "resume at their failed turn" in redriven.stdout, redriven.stdout
        log = tmp / f"requests-{name}.jsonl"
        # Lengths are a function of the request: the cut step is as long
        # again in the redrive, and fits in 8192.
        sim = SimulatorProcess(SimulatorConfig(
            zero_delay=True, length_median=350, length_max=6000, tool_call_parser="qwen25",
            tool_call_rate=0.5, model_path="sim/Qwen3", speculative_accept_length=2.5,
            request_log=str(log)), port=free_port())
        url = sim.start()
        try:
            generate(env, tmp, ids[name], url)
        finally:
            sim.terminate()
        run_id = ids[name]
        r.lines[run_id] = {line["id"]: line for line in s3_lines(settings, run_id)}
        r.dead[run_id] = dead_letters(settings, run_id)
        r.requests[run_id] = requests_by_step(log)
    r.prompts = prompt_ids(settings, ids[ROOT])
    yield r
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def failed_step(letter: dict[str, Any]) -> int:
    """The step the sink's detail names (`step 3 (user turn 2): ...`)."""
    found = re.match(r"step (\d+)", letter["detail"])
    assert found, letter["detail"]
    return int(found.group(1))


def test_the_redrive_requests_no_finished_step_again(runs: Runs) -> None:
    root, child = runs.built.run_ids[ROOT], runs.built.run_ids[CHILD]
    cut = {pid: failed_step(letter) for pid, letter in runs.dead[root].items()
           if letter["reason"] == "length"}
    assert len(cut) >= 5 and any(k > 0 for k in cut.values()), cut
    assert set(prompt_ids(runs.built.settings, child)) == set(cut)
    requested = runs.requests[child]
    assert {pid for pid, _ in requested} == set(cut)
    resumed = 0
    for pid, k in cut.items():
        steps = sorted(step for conv, step in requested if conv == pid)
        assert steps and steps[0] == k, (pid, k, steps)  # nothing before the cut step
        assert steps == list(range(k, steps[-1] + 1))
        assert all(len(requested[(pid, s)]) == 1 for s in steps)  # and nothing twice
        # The cut step's request carries exactly the turns the parent generated.
        assert requested[(pid, k)] == runs.requests[root][(pid, k)]
        resumed += k > 0
        line = runs.lines[child].get(pid)
        if line is not None:
            parent_steps = runs.dead[root][pid]["record"]["steps"]
            assert [s.get("carried", False) for s in line["steps"]] == \
                [True] * k + [False] * (len(line["steps"]) - k)
            assert [s["content"] for s in line["steps"][:k]] == \
                [s.get("content") for s in parent_steps[:k]]
    assert resumed > 0
    assert len(runs.lines[child]) > 0
    print(f"{len(cut)} conversations cut at length, {resumed} resumed after carried steps; "
          f"{len(runs.lines[child])} finished by the redrive; {len(requested)} steps requested "
          f"by it, {len(runs.requests[root])} by the parent")


def assistant_texts(row: dict[str, Any], fmt: str) -> list[Any]:
    """(content, reasoning) of every assistant message of a row."""
    if fmt == "sharegpt":
        return [t["value"] for t in row["conversations"] if t["from"] == "gpt"]
    messages = row["conversations" if fmt == "specforge" else "messages"]
    return [(m.get("content") or "", m.get("reasoning_content") or "") for m in messages
            if m["role"] == "assistant"]


def stored_texts(steps: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(content, reasoning) of every stored generated step."""
    return [(s.get("content") or "", s.get("reasoning_content") or "") for s in steps]


def runner(env: dict[str, str]) -> Callable[..., subprocess.CompletedProcess[str]]:
    """The tokenmill command line with this environment."""
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(cli(*args), env=env, capture_output=True, text=True, timeout=300,
                              cwd=REPO, check=False)
    return run


def check_exports(run: Callable[..., subprocess.CompletedProcess[str]], tmp: Path,
                  run_id: str, finished: dict[str, dict[str, Any]], partial: int,
                  prompts: int) -> None:
    """Export `run_id`'s lineage in every format (`run`: the tokenmill
    command line) and check each against the stored S3 lines of the finished
    conversations (`finished`, by id; `partial` more were accepted)."""
    for fmt in FORMATS:
        out = tmp / f"export-{fmt}"
        result = run("export", run_id, "--format", fmt, "--out", str(out), "--shard-records",
                     "25", "--no-progress")
        assert result.returncode == 0, result.stderr[-3000:]
        assert f"{len(finished):,} conversations" in result.stdout, result.stdout
        rows = read_export(out, fmt)
        ids = [row["id"] for row in rows]
        assert len(ids) == len(set(ids)) and set(ids) == set(finished), fmt
        assert "DATASET ANSWER" not in json.dumps(rows, default=str)
        for row in rows:
            line = finished[row["id"]]
            steps = line["steps"]
            if fmt in ("openai", "parquet"):
                assert row["run"] == line["run"]
            if fmt == "sharegpt":  # rendered text: checked through the template below
                assert len(assistant_texts(row, fmt)) == len(steps)
            elif fmt != "specforge":  # specforge: below, the way SpecForge loads it
                assert assistant_texts(row, fmt) == stored_texts(steps)
        manifest = json.loads((out / "manifest.json").read_text())
        assert sum(s["left_out"] for s in manifest["shards"]) == partial
        assert manifest["plan"]["conversations"] is True
        card = (out / "README.md").read_text()
        assert f"conversations: {len(finished):,} of {prompts} prompts" in card
        assert f"{partial:,} left out" in card
    # SpecForge's loader, then the Qwen3 template: the stored turns come back,
    # the same text the ShareGPT rows hold.
    spec_rows = b"".join((tmp / "export-specforge" / s["name"]).read_bytes()
                         for s in json.loads((tmp / "export-specforge" / "manifest.json")
                                             .read_text())["shards"])
    sharegpt = {row["id"]: row for row in read_export(tmp / "export-sharegpt", "sharegpt")}
    ids = [json.loads(line)["id"] for line in spec_rows.splitlines()]
    for pid, row in zip(ids, load_like_specforge(spec_rows), strict=True):
        steps = finished[pid]["steps"]
        said = [m for m in row["conversations"] if m["role"] == "assistant"]
        assert [(m["content"], m["reasoning_content"]) for m in said] == stored_texts(steps)
        assert assistant_blocks(qwen3_render(row["conversations"])) == \
            assistant_texts(sharegpt[pid], "sharegpt")


def test_every_format_holds_each_conversation_once_from_the_newest_run(runs: Runs) -> None:
    built = runs.built
    expected = {pid: runs.winner(pid) for pid in runs.prompts}
    finished = {pid: line for pid, line in expected.items()
                if line is not None and line["outcome"] == "finished"}
    partial = {pid for pid, line in expected.items()
               if line is not None and line["outcome"] != "finished"}
    assert partial, "no tool_unresolved conversation to leave out"
    assert any(line["run"] == built.run_ids[CHILD] for line in finished.values())
    check_exports(built.run, built.tmp, built.run_ids[CHILD], finished, len(partial),
                  len(runs.prompts))


def test_partial_conversations_are_exported_cut_with_include_partial(runs: Runs) -> None:
    built = runs.built
    out = built.tmp / "export-partial"
    result = built.run("export", built.run_ids[CHILD], "--format", "openai", "--out", str(out),
                       "--include-partial", "--no-progress")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {row["id"]: row for row in read_export(out, "openai")}
    expected = {pid: runs.winner(pid) for pid in runs.prompts}
    partial = {pid: line for pid, line in expected.items()
               if line is not None and line["outcome"] != "finished"}
    kept = 0
    for pid, line in partial.items():
        unfinished = line["steps"][-1]["turn"]
        complete = [s for s in line["steps"] if s["turn"] < unfinished]
        if not complete:
            assert pid not in rows
            continue
        kept += 1
        row = rows[pid]
        assert row["outcome"] == line["outcome"]
        assert assistant_texts(row, "openai") == stored_texts(complete)
        assert row["messages"][-1]["role"] == "assistant"
        assert not row["messages"][-1].get("tool_calls")
    manifest = json.loads((out / "manifest.json").read_text())
    stats = [r for s in manifest["shards"] for r in s["runs"].values()]
    assert sum(r["partial"] for r in stats) == kept
    assert sum(r["left_out"] for r in stats) == len(partial) - kept
    assert len(rows) == sum(1 for line in expected.values()
                            if line is not None and line["outcome"] == "finished") + kept
    assert kept > 0, "no partial conversation with a complete turn"
    print(f"{len(partial)} partial conversations: {kept} exported cut, "
          f"{len(partial) - kept} left out")


def test_dataset_counts_conversations(runs: Runs) -> None:
    built = runs.built
    result = built.run("dataset", built.run_ids[CHILD], "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["unit"] == "conversations" and report["prompts"] == 90
    with_result = sum(1 for pid in runs.prompts if runs.winner(pid) is not None)
    assert report["with_result"] == with_result
    assert [p["results"] for p in report["parts"]] == [
        sum(1 for pid in runs.prompts if (w := runs.winner(pid)) is not None and w["run"] == run)
        for run in (built.run_ids[ROOT], built.run_ids[CHILD])]
    shown = " ".join(built.run("dataset", built.run_ids[ROOT]).stdout.split())
    assert f"{with_result:,} of 90 conversations have an accepted result" in shown
