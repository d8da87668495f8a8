"""regenerate-turns end to end on the real broker: producer -> 3 workers ->
sink, with workers killed between turns (inside a commit, by the shared
fault injector) and during turns (SIGKILL with requests in flight), and the
sink killed once. Checked with clients that share no code with tokenmill
(kafka-python read_committed, boto3) and with the simulator's request log:

- every conversation is stored exactly once (S3 line or dead letter), and
  `.completions` holds exactly one record per conversation;
- every intermediate turn was committed exactly once to `.turns`, each a
  prefix of the stored conversation;
- turn k's request (every attempt, redone ones included) carried exactly the
  answers stored for turns 0..k-1, and nothing was requested past the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import boto3
import msgspec
import pytest
from confluent_kafka import Producer

from devstack.processes import free_port
from schemas import Conversation, Message, PromptRecord, Step, decode_completion
from schemas.turn import TurnRecord, decode_turn
from sglang_sim import SimulatorConfig
from sglang_sim.runner import SimulatorProcess
from tests.dataset.test_lineage_e2e import generate
from tests.e2e.test_pipeline import Service, cli, s3_keys
from tests.gate import Gate
from tests.kafka_helpers import read_all
from tokenmill.conversation import transcript, user_turns

pytestmark = [pytest.mark.broker, pytest.mark.s3, pytest.mark.slow]

CONVERSATIONS = 300


def write_conversations(path: Path, n: int) -> dict[int, int]:
    """n OpenAI-format chats of 1-6 user turns (the dataset's answers are
    there, and must never be sent); returns {user turns: conversations}."""
    shape: Counter[int] = Counter()
    with path.open("w") as f:
        for i in range(n):
            users = 1 + i % 6
            shape[users] += 1
            messages = [{"role": "system", "content": f"You are assistant {i}."}] if i % 2 else []
            for t in range(users):
                messages.append({"role": "user", "content": f"Chat {i}, question {t}?"})
                messages.append({"role": "assistant", "content": f"DATASET ANSWER {i}.{t}"})
            f.write(json.dumps({"messages": messages}) + "\n")
    return dict(shape)


def s3_lines(settings: Any) -> list[dict[str, Any]]:
    s3 = boto3.client("s3", endpoint_url=settings.s3_endpoint_url, region_name="us-east-1")
    lines = []
    for key in s3_keys(settings):
        body = s3.get_object(Bucket=settings.s3_bucket, Key=key)["Body"].read()
        lines += [json.loads(line) for line in body.splitlines() if line.strip()]
    return lines


def requests_by_step(log: Path) -> dict[tuple[str, int], list[list[dict[str, Any]]]]:
    """(conversation id, step) -> the messages of every request logged for it."""
    out: dict[tuple[str, int], list[list[dict[str, Any]]]] = defaultdict(list)
    for line in log.read_text().splitlines():
        entry = json.loads(line)
        conversation, _, step = entry["rid"].split(".")[0].rpartition("-s")
        out[(conversation, int(step))].append(entry["messages"])
    return out


def stack_env(settings: Any, tmp_path: Path) -> dict[str, str]:
    """The services' environment (and the bucket they write to)."""
    boto3.client("s3", endpoint_url=settings.s3_endpoint_url,
                 region_name="us-east-1").create_bucket(Bucket=settings.s3_bucket)
    return {**os.environ, "TOKENMILL_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
            "TOKENMILL_S3_ENDPOINT_URL": settings.s3_endpoint_url,
            "TOKENMILL_S3_BUCKET": settings.s3_bucket, "TOKENMILL_LOG_FORMAT": "json",
            "TOKENMILL_STATE_DIR": str(tmp_path / "state"), "PYTHONUNBUFFERED": "1"}


def produce(env: dict[str, str], tmp_path: Path, dataset: Path, run_id: str, *args: str) -> None:
    produced = Service("producer", cli("produce", str(dataset), "--run", run_id,
                                       "--partitions-per-gpu", "2", "--max-tokens", "2048",
                                       "--multi-turn", "regenerate-turns", "--no-progress",
                                       *args), env, tmp_path).start()
    assert produced.wait(300) == 0, produced.tail()


def sink_service(env: dict[str, str], tmp_path: Path, run_id: str) -> Service:
    return Service("sink", cli("sink", "--run", run_id, "--instance", "s0", "--until-done",
                               "--batch-size", "50", "--max-batch-age", "1",
                               "--session-timeout", "6"), env, tmp_path)


def count(settings: Any, topic: str) -> int:
    return len(read_all(settings.bootstrap_servers, topic))


def test_conversations_survive_kills_between_and_during_turns(settings, services, run_id,
                                                              tmp_path) -> None:
    env = stack_env(settings, tmp_path)
    dataset = tmp_path / "chats.jsonl"
    shape = write_conversations(dataset, CONVERSATIONS)
    produce(env, tmp_path, dataset, run_id, "--gpus", "3")

    request_log = tmp_path / "requests.jsonl"
    # ~0.1-0.5 s per request: kills catch requests in flight.
    sim = SimulatorProcess(SimulatorConfig(time_scale=100, decode_rate=60.0, prefill_rate=0,
                                           max_running_requests=128, length_median=400,
                                           length_max=1500, request_log=str(request_log)),
                           port=free_port())
    url = sim.start()
    # The last conversation's requests wait in a gate until w0's kill has
    # landed: every kill below is mid-run by construction.
    gate = Gate(url).__enter__()
    last = gate.hold(containing=[f"Chat {CONVERSATIONS - 1}, question 0?"])

    def worker(i: int, kill_at: str | None = None) -> Service:
        entry = ["tests.faults", "--kill-at", kill_at, "--"] if kill_at else ["tokenmill.cli"]

        return Service(f"worker{i}", [sys.executable, "-m", *entry, "consume", "--run", run_id,
                                      "--sglang-url", gate.url(f"w{i}"), "--instance", f"w{i}",
                                      "--until-done", "--concurrency", "24",
                                      "--commit-interval", "0.5", "--session-timeout", "6"],
                       env, tmp_path)

    # w0 dies inside its 3rd commit (records flushed, not committed): between turns.
    workers = [worker(0, "transaction.committing:3"), worker(1), worker(2)]
    sink = sink_service(env, tmp_path, run_id)
    turns_topic = f"tokenmill.{run_id}.turns"
    completions_topic = f"tokenmill.{run_id}.completions"
    # One deadline inside pytest's 300 s: a stuck run fails with the logs' tails.
    finish_by = time.monotonic() + 270

    def left() -> float:
        return max(1.0, finish_by - time.monotonic())

    try:
        for service in (*workers, sink):
            service.start()
        # During turns: w1 killed with requests in flight once conversations
        # are under way, and the sink after its first upload.
        while not count(settings, turns_topic) > 50:
            assert time.monotonic() < finish_by, "the run never got going"
            time.sleep(0.3)  # poll of a wait loop
        workers[1].kill()
        at_kill1 = count(settings, turns_topic), count(settings, completions_topic)
        workers[1].start()
        while not s3_keys(settings):
            assert time.monotonic() < finish_by, "the sink never uploaded"
            time.sleep(0.3)  # poll of a wait loop
        sink.kill()
        sink.start()
        assert workers[0].wait(left()) == 137, workers[0].tail()
        assert "fault injection: killed" in workers[0].log.read_text()
        at_kill0 = count(settings, turns_topic), count(settings, completions_topic)
        workers[0] = worker(0)
        workers[0].start()
        last.release()  # the kills have landed: the run may finish
        for service in workers:
            assert service.wait(left()) == 0, service.tail()
        assert sink.wait(left()) == 0, sink.tail()
    finally:
        for service in (*workers, sink):
            service.stop()
        gate.__exit__(None, None, None)
        sim.terminate()

    published = [r.key.decode() for r in
                 read_all(settings.bootstrap_servers, f"tokenmill.{run_id}.prompts")]
    assert len(published) == len(set(published)) == CONVERSATIONS

    # One committed record per conversation, every one a whole conversation.
    records = [decode_completion(r.value) for r in
               read_all(settings.bootstrap_servers, completions_topic)]
    assert sorted(r.id for r in records) == sorted(published)
    assert all(isinstance(r, Conversation) and r.outcome == "finished" for r in records)
    by_id = {r.id: r for r in records}
    assert Counter(len(r.steps) for r in records) == Counter(
        {users: n for users, n in shape.items()})
    for r in records:
        assert len(r.steps) == user_turns(r.prompt.messages)
        assert [s.turn for s in r.steps] == list(range(len(r.steps)))

    # Every intermediate turn committed once, as a prefix of the stored conversation.
    turns = [decode_turn(r.value) for r in read_all(settings.bootstrap_servers, turns_topic)]
    seen = Counter((t.id, len(t.steps)) for t in turns)
    assert [k for k, v in seen.items() if v > 1] == []
    assert set(seen) == {(r.id, k) for r in records for k in range(1, len(r.steps))}
    assert all(t.steps == by_id[t.id].steps[:len(t.steps)] for t in turns)

    # What each request carried: exactly the stored answers before it.
    requested = requests_by_step(request_log)
    for r in records:
        for k, step in enumerate(r.steps):
            expected = list(msgspec.to_builtins(transcript(r.prompt.messages, r.steps[:k],
                                                           step.turn)))
            sent = requested[(r.id, k)]
            assert sent and all(messages == expected for messages in sent), (r.id, k)
        assert (r.id, len(r.steps)) not in requested
    assert not any("DATASET ANSWER" in json.dumps(m) for sent in requested.values() for m in sent)
    redone = sum(len(v) - 1 for v in requested.values())
    assert redone > 0  # the kills caught requests in flight; their redos carried the same

    # Stored once: S3 lines and dead letters together hold each conversation once.
    lines = s3_lines(settings)
    dlq = [json.loads(r.value)["id"] for r in
           read_all(settings.bootstrap_servers, f"tokenmill.{run_id}.dlq")]
    everything = Counter(line["id"] for line in lines) + Counter(dlq)
    assert [k for k, v in everything.items() if v > 1] == []
    assert set(everything) == set(published)
    for line in lines:
        assert line["kind"] == "conversation"
        assert len(line["steps"]) == len(by_id[line["id"]].steps)
        assert [m["role"] for m in line["messages"]].count("assistant") == len(line["steps"])
    # status counts the same turns and conversations from committed counters.
    status = subprocess.run(cli("status", "--run", run_id, "--json"), env=env,
                            capture_output=True, text=True, timeout=120)
    assert status.returncode == 0, status.stderr[-2000:]
    assert json.loads(status.stdout)["conversations"] == {
        "turns": len(requested), "finished": CONVERSATIONS, "failed": 0, "in_progress": 0,
        "not_started": 0}
    # The run exported in every format: each conversation once, every
    # assistant message the stored step (tests/dataset/test_conversations_e2e.py).
    from tests.dataset.test_conversations_e2e import check_exports, runner

    check_exports(runner(env), tmp_path, run_id, {line["id"]: line for line in lines}, 0,
                  CONVERSATIONS)
    # The run's charts, seen in a browser: the conversations' turns and tool
    # rounds drew from every conversation (tests/report/test_page.py).
    from tests.report.browser import blank_charts, look

    report = subprocess.run(cli("report", run_id, "--out", str(tmp_path / "report")), env=env,
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr[-2000:]
    figures = json.loads((tmp_path / "report" / "report.json").read_text())
    assert figures["conversations"] == sum(figures["turns"]["counts"]) == CONVERSATIONS
    seen = look(tmp_path / "report" / "report.html")
    drawn = {chart.id for chart in seen.charts if chart.plot}
    assert {"turns", "tool-rounds", "throughput", "progress", "finish-category"} <= drawn
    assert blank_charts(seen) == [] and seen.console == []
    print(f"kills: w0 in a commit at turns/completions {at_kill0}, w1 at {at_kill1}; "
          f"{len(requested)} steps, {redone} requests redone after kills; "
          f"{len(lines)} conversations in S3, {len(dlq)} dead-lettered")


def test_malformed_turn_records_are_dead_lettered_and_the_run_goes_on(settings, services, run_id,
                                                                      tmp_path) -> None:
    env = stack_env(settings, tmp_path)
    dataset = tmp_path / "chats.jsonl"
    write_conversations(dataset, 12)
    produce(env, tmp_path, dataset, run_id, "--gpus", "1")
    turns_topic = f"tokenmill.{run_id}.turns"
    prompt = PromptRecord(id="x", run=run_id, messages=(Message(role="user", content="hi"),),
                          source="s", format="openai", category="plain")
    foreign = TurnRecord(id="x", run="other-run", settings_hash="h", prompt=prompt,
                         steps=(Step(turn=0, finish_reason="stop"),), next_turn=0)
    hostile = Producer({"bootstrap.servers": settings.bootstrap_servers})
    for value in (b"not json", msgspec.json.encode(foreign), None):
        hostile.produce(turns_topic, value=value, partition=0)
    assert hostile.flush(30) == 0
    simulator = SimulatorProcess(SimulatorConfig(time_scale=1000, prefill_rate=0,
                                                 length_median=200, length_max=600),
                                 port=free_port())
    url = simulator.start()
    try:
        generate(env, tmp_path, run_id, url)
    finally:
        simulator.terminate()
    dlq = read_all(settings.bootstrap_servers, f"tokenmill.{run_id}.dlq")
    invalid = [json.loads(r.value) for r in dlq
               if dict(r.headers)["tokenmill.dlq.reason"] == b"invalid"]
    assert len(invalid) == 3
    assert {d["record"]["raw"]["topic"] for d in invalid} == {turns_topic}
    assert len(s3_lines(settings)) + len(dlq) - 3 == 12
