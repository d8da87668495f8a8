"""The two sides of the consumer and fleet benchmarks, timed the same way.

- tokenmill: `tokenmill consume` processes (one per server), wall clock from
  the first launch to the moment the run's group has committed the offset of
  its last prompt on every partition (results and offsets commit in one
  transaction, so that is when the last result became visible);
- baseline: `bench/plain_loop.py` in its own process, wall clock from its
  launch to its last answer.

Both get the same request bodies against the same kind of simulator; CPU
seconds (user + system of every process, launch to exit) are reported apart.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
from confluent_kafka import TopicPartition

from bench.services import ROOT, child_env, tokenmill_argv
from bench.timing import CommittedReached, DeliveredEnds, Launched, ProgressReached, wait_until
from consumer.sglang_client import request_body
from schemas import (
    Completion,
    CompletionRecord,
    Conversation,
    GenerationSettings,
    Message,
    PromptRecord,
    RunSpec,
    decode_completion,
)
from schemas.progress import ProducerCheckpoint, producer_key
from tokenmill.kafka import clients, topics
from tokenmill.registry import RunRegistry
from tokenmill.settings import Settings

EXIT_AFTER_DONE_S = 120.0  # --until-done checks every few seconds, then drains and closes


@dataclass
class Side:
    wall_s: float  # launch to the last committed result / last answer
    cpu_s: float  # every process of the side, launch to exit
    answers: int
    completion_tokens: int
    notes: list[str] = field(default_factory=list)  # e.g. a worker that never exited


@dataclass
class BenchRun:
    spec: RunSpec
    ends: dict[int, int]  # prompts partition -> last offset + 1


def prompts_for(run_id: str, n: int, turns: int = 1) -> list[PromptRecord]:
    """n prompts; with `turns` > 1, conversations of that many user turns
    (with the dataset's answers, which a regenerate-turns run never sends)."""
    def messages(i: int) -> tuple[Message, ...]:
        out: list[Message] = []
        for t in range(turns):
            out.append(Message(role="user", content=f"Benchmark question {i}.{t}?"))
            if turns > 1:
                out.append(Message(role="assistant", content=f"Dataset answer {i}.{t}."))
        return tuple(out)
    return [PromptRecord(id=f"{run_id}-{i}", run=run_id, source="bench", format="plain",
                         category="plain" if turns == 1 else "multi-turn", seq=i,
                         messages=messages(i))
            for i in range(n)]


def setup_run(settings: Settings, n: int, partitions: int, max_tokens: int,
              gpus: int | None = None, turns: int = 1) -> BenchRun:
    """A run with n prompts published and the producer marked done (as
    `produce --gpus` would plan it when `gpus` is given); with `turns` > 1 a
    regenerate-turns run of n conversations."""
    run_id = f"bench{uuid.uuid4().hex[:8]}"
    spec = RunSpec(run_id=run_id, partitions=partitions, gpus=gpus,
                   generation=GenerationSettings(model="sim", max_tokens=max_tokens),
                   multi_turn="regenerate-turns" if turns > 1 else "last-user")
    RunRegistry(settings).create_run(spec)
    ends = DeliveredEnds()
    producer = clients.transactional_producer(settings, f"bench.{run_id}",
                                                    {"linger.ms": 20})
    producer.init_transactions(30)
    producer.begin_transaction()
    for prompt in prompts_for(run_id, n, turns):
        producer.produce(topics.prompts_topic(run_id), key=prompt.id.encode(),
                         value=msgspec.json.encode(prompt), partition=prompt.seq % partitions,
                         on_delivery=ends)
        producer.poll(0)
    producer.produce(topics.progress_topic(run_id), key=producer_key(run_id).encode(),
                     value=msgspec.json.encode(ProducerCheckpoint(run=run_id, next_seq=n, total=n,
                                                                  done=True)))
    producer.commit_transaction(60)
    producer.flush(30)
    return BenchRun(spec, dict(ends.ends))


def write_bodies(path: Path, n: int, generation: GenerationSettings) -> Path:
    """The exact request bodies tokenmill sends for the same prompts."""
    with path.open("wb") as fh:
        for prompt in prompts_for("plain", n):
            fh.write(msgspec.json.encode(request_body(prompt, generation)) + b"\n")
    return path


def plain_loop(urls: list[str], n: int, concurrency: int, generation: GenerationSettings,
               work: Path) -> Side:
    bodies = write_bodies(work / f"bodies-{uuid.uuid4().hex[:6]}.jsonl", n, generation)
    argv = [sys.executable, str(ROOT / "bench" / "plain_loop.py"), "--bodies", str(bodies),
            "--concurrency", str(concurrency)]
    for url in urls:
        argv += ["--url", url]
    proc = Launched(argv, env=os.environ, log=work / "plain-loop.log", cwd=ROOT)
    exited = proc.wait(3600)
    if exited.code != 0:
        raise RuntimeError(f"plain loop failed ({exited.code}); log: {proc.log}")
    report = json.loads(exited.stdout.strip().splitlines()[-1])
    if report["answers"] != n:
        raise RuntimeError(f"plain loop answered {report['answers']} of {n}")
    return Side(report["last_at"] - proc.launched_at, exited.cpu_s, report["answers"],
                report["completion_tokens"])


def consume_argv(run_id: str, url: str, instance: str, *flags: str) -> list[str]:
    return tokenmill_argv("consume", "--run", run_id, "--sglang-url", url,
                          "--instance", instance, "--until-done", *flags)


def tokenmill_side(settings: Settings, run: BenchRun, urls: list[str], work: Path,
                   *flags: str, timeout_s: float = 1800, by_progress: bool = False) -> Side:
    """One `tokenmill consume` per server, launched together; timed to the
    group's last commit (`by_progress`: to the commit whose counters count
    the last result, for runs whose inputs grow, regenerate-turns), then
    left to exit by themselves (--until-done)."""
    run_id = run.spec.run_id
    env = child_env(settings)
    procs = [Launched(consume_argv(run_id, url, f"w{i}", *flags), env=env,
                      log=work / f"{run_id}-w{i}.log", cwd=ROOT)
             for i, url in enumerate(urls)]
    committed: CommittedReached | ProgressReached = (
        ProgressReached(settings, run_id) if by_progress else
        CommittedReached(settings, topics.generate_group(run_id), topics.prompts_topic(run_id),
                         run.ends))
    try:
        done_at = wait_until(committed, procs, timeout_s, "commit of every prompt")
        exits = [p.wait_or_kill(EXIT_AFTER_DONE_S) for p in procs]
    finally:
        committed.close()
        for p in procs:
            p.kill()
    # Everything is committed by now: a worker that does not exit is a bug to
    # report beside the figure, not a reason to lose the measurement.
    notes = [f"`tokenmill consume` w{i} was still running {EXIT_AFTER_DONE_S:.0f} s after "
             "the run's last commit (--until-done); killed" for i, p in enumerate(procs)
             if p.killed]
    for p in procs:
        if p.killed:
            print(f"did not exit after the run: {p.log}", file=sys.stderr)
    failed = [e.code for p, e in zip(procs, exits, strict=True) if not p.killed and e.code != 0]
    if failed:
        raise RuntimeError(f"workers exited with {failed}; logs in {work}")
    answers, tokens = committed_results(settings, run_id)
    return Side(done_at - procs[0].launched_at, sum(e.cpu_s for e in exits), answers, tokens,
                notes)


def completion_tokens(record: CompletionRecord) -> int:
    if isinstance(record, Conversation):
        return sum(step.usage.completion_tokens for step in record.steps)
    return record.usage.completion_tokens if isinstance(record, Completion) else 0


def committed_results(settings: Settings, run_id: str) -> tuple[int, int]:
    """(committed completions, their completion tokens), read_committed."""
    consumer = clients.consumer(settings, f"bench-read-{uuid.uuid4().hex[:6]}",
                                      {"enable.partition.eof": True})
    topic = topics.completions_topic(run_id)
    parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in parts])
    remaining, count, tokens = set(parts), 0, 0
    while remaining:
        for m in consumer.consume(1000, timeout=1):
            if m.error():
                remaining.discard(m.partition())
                continue
            value = m.value()
            if value is None:  # no tombstones in a completions topic; skip, not crash
                continue
            count += 1
            tokens += completion_tokens(decode_completion(value))
    consumer.close()
    return count, tokens
