"""Helpers for consumer tests: publish prompts the way the producer does
(transactionally, with a final checkpoint), run `tokenmill consume` as real
processes, and read back what was committed with kafka-python."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec
from confluent_kafka import Producer

from schemas import GenerationSettings, Message, PromptRecord, RunSpec, decode_completion
from schemas.progress import ProducerCheckpoint, producer_key
from sglang_sim import SimulatorConfig
from tests.kafka_helpers import read_all
from tests.service_process import REPO as REPO  # re-exported: tests import it from here
from tests.service_process import ServiceProcess, entry
from tokenmill import progress
from tokenmill.kafka import topics
from tokenmill.registry import RunRegistry
from tokenmill.settings import Settings

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


def make_prompts(run_id: str, n: int, *, tools_every: int = 0, long_every: int = 0,
                 long_chars: int = 200_000) -> list[PromptRecord]:
    prompts = []
    for i in range(n):
        text = f"Question {i}: explain topic number {i} in detail."
        tools = None
        category = "plain"
        if long_every and i % long_every == 0:
            text = "x " * (long_chars // 2)
        elif tools_every and i % tools_every == 0:
            tools = (WEATHER_TOOL,)
            category = "tools"
        prompts.append(PromptRecord(
            id=f"p{i:06d}", run=run_id, messages=(Message(role="user", content=text),),
            source="test.jsonl", format="plain", category=category, line=i + 1, tools=tools,
            seq=i))
    return prompts


def create_run(settings: Settings, run_id: str, partitions: int, *, max_tokens: int = 256,
               **generation: Any) -> RunSpec:
    spec = RunSpec(run_id=run_id, partitions=partitions,
                   generation=GenerationSettings(model="sim", max_tokens=max_tokens, **generation))
    RunRegistry(settings).create_run(spec)
    return spec


class Publisher:
    """Publishes a run's prompts the way the producer does, as far as the
    test says when it says (a run is held unfinished until its last prompts
    are out): round-robin over partitions, in transactions, each with its
    checkpoint, the last one done."""

    def __init__(self, settings: Settings, spec: RunSpec, prompts: list[PromptRecord]) -> None:
        self.spec, self.prompts = spec, prompts
        self.producer = Producer({"bootstrap.servers": settings.bootstrap_servers,
                                  "transactional.id": f"test.{spec.run_id}.publisher"})
        self.producer.init_transactions(30)
        self.per_partition = [0] * spec.partitions
        self.out = 0  # prompts published so far

    def to(self, end: int, *, chunk: int = 500, pace_s: float = 0.0) -> None:
        """Publishes the prompts up to `end` (the rest of them: the run's
        publishing is done), in transactions of `chunk` prompts, one every
        `pace_s` seconds (a producer streaming its input)."""
        spec = self.spec
        for start in range(self.out, end, chunk):
            if start > self.out and pace_s:
                time.sleep(pace_s)  # a paced input: the producer's pace, not a wait
            self.producer.begin_transaction()
            for prompt in self.prompts[start:min(start + chunk, end)]:
                partition = prompt.seq % spec.partitions
                self.per_partition[partition] += 1
                self.producer.produce(topics.prompts_topic(spec.run_id),
                                      key=prompt.id.encode(),
                                      value=msgspec.json.encode(prompt), partition=partition)
            published = min(start + chunk, end)
            checkpoint = ProducerCheckpoint(run=spec.run_id, next_seq=published,
                                            total=len(self.prompts),
                                            done=published == len(self.prompts),
                                            per_partition=tuple(self.per_partition))
            self.producer.produce(topics.progress_topic(spec.run_id),
                                  key=producer_key(spec.run_id).encode(),
                                  value=msgspec.json.encode(checkpoint))
            self.producer.commit_transaction(30)
        self.out = max(self.out, end)

    def ahead(self, of: int, by: int) -> None:
        """Publishes up to `by` prompts past `of` (e.g. the requests served),
        short of the last one: work stays ahead, and the run unfinished."""
        self.to(max(self.out, min(of + by, len(self.prompts) - 1)))

    def rest(self) -> None:
        self.to(len(self.prompts))


def publish(settings: Settings, spec: RunSpec, prompts: list[PromptRecord], *,
            chunk: int = 500, pace_s: float = 0.0) -> None:
    """All of a run's prompts (Publisher), ending with a done checkpoint."""
    Publisher(settings, spec, prompts).to(len(prompts), chunk=chunk, pace_s=pace_s)


def committed_records(settings: Settings, run_id: str) -> list[Any]:
    return [decode_completion(r.value) for r in
            read_all(settings.bootstrap_servers, topics.completions_topic(run_id), timeout_s=60)]


def duplicates(records: list[Any]) -> dict[str, int]:
    counts = Counter(r.id for r in records)
    return {k: v for k, v in counts.items() if v > 1}


class ConsumerProcess(ServiceProcess):
    """`tokenmill consume` as a child process, killable like a real worker."""

    def __init__(self, settings: Settings, run_id: str, sglang_url: str, instance: str,
                 log_dir: Path, *extra: str, kill_at: str | None = None,
                 faults: Sequence[str] = (), session_s: float = 6.0) -> None:
        """`kill_at` ("STEP:N"): die at that step of the Nth transaction;
        `faults`: more of tests/faults.py's options."""
        super().__init__([*entry(kill_at, faults), "consume", "--run", run_id,
                          "--sglang-url", sglang_url, "--instance", instance,
                          "--bootstrap-servers", settings.bootstrap_servers,
                          "--log-format", "json", "--session-timeout", f"{session_s:g}",
                          "--commit-interval", "0.5", *extra],
                         log_dir / f"consumer-{instance}.log")
        self.instance = instance


# ~0.2-0.6 s per request: slow enough that crashes and commits catch work in
# flight (a commit every 0.5 s holds a few dozen results).
PACED = SimulatorConfig(decode_rate=200.0, length_median=60, length_sigma=0.4, length_max=200,
                        max_running_requests=256, prefill_rate=0)


def check_exactly_once(settings: Settings, run_id: str, prompts: list[PromptRecord]) -> list[Any]:
    """Every prompt has exactly one committed record; returns the records."""
    records = committed_records(settings, run_id)
    assert duplicates(records) == {}
    assert {r.id for r in records} == {p.id for p in prompts}
    return records


def event_time(event: dict[str, Any]) -> float:
    """A JSON log event's timestamp, as time.time() seconds."""
    return datetime.fromisoformat(str(event["timestamp"])).timestamp()


def wait_until(predicate: Any, timeout_s: float, message: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)  # poll of a wait loop
    raise AssertionError(f"{message} not reached within {timeout_s}s")


def sim_metrics(url: str) -> dict[str, float]:
    """SGLang metrics from the simulator, summed over label sets."""
    import urllib.request

    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        text = response.read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("sglang:"):
            name = line.split("{")[0].split(" ")[0]
            values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return values


def consumer_progress(settings: Settings, run_id: str) -> Any:
    return progress.read_run_progress(settings, run_id)


def committed_results(settings: Settings, run_id: str, instance: str) -> int:
    """Results `instance` has committed. Not "has a progress record": a
    worker that committed nothing for `heartbeat_s` (a slow start on a
    loaded machine) commits its progress record alone, with no results."""
    mine = consumer_progress(settings, run_id).consumers.get(instance)
    return 0 if mine is None else mine.completions + mine.failures
