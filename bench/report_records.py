"""Synthetic results shaped like a thinking model's, for `tokenmill report`'s
benchmark and tests: S3 lines and dead letters encoded from the real
schemas (schemas/completion.py, schemas/dlq.py), and progress records of a
few GPUs. Deterministic for a seed."""

from __future__ import annotations

import random
from collections.abc import Iterator

import msgspec

from schemas import Completion, DeadLetter, Failure, Message, PromptRecord
from schemas.completion import Conversation, SpecStats, Step, Usage
from schemas.messages import FunctionCall, ToolCall
from schemas.progress import ConsumerProgress, ProducerCheckpoint
from schemas.prompt import Category
from sink.samples import conversation_sample, encode_line, sample_line

CATEGORIES: tuple[Category, ...] = ("plain", "system-prompt", "multi-turn", "tools")
SOURCES = tuple(f"data/source-{i:02d}.jsonl" for i in range(16))
_encoder = msgspec.json.Encoder()


def _prompt(rng: random.Random, i: int, run: str) -> PromptRecord:
    category = CATEGORIES[min(int(rng.expovariate(1.2)), 3)]
    return PromptRecord(id=f"{i:032x}", run=run, messages=(Message("user", f"Question {i}?"),),
                        source=SOURCES[min(int(rng.expovariate(0.35)), len(SOURCES) - 1)],
                        format="openai", category=category, line=i + 1, seq=i)


def _tokens(rng: random.Random, max_tokens: int) -> tuple[int, str]:
    tokens = int(rng.lognormvariate(7.3, 0.7))
    return (max_tokens, "length") if tokens >= max_tokens else (tokens, "stop")


def _spec(rng: random.Random, gpu: int, spec: bool) -> SpecStats:
    if not spec:
        return SpecStats()
    return SpecStats(accept_length=max(1.0, rng.gauss(2.6 + 0.3 * gpu, 0.5)), verify_ct=100)


def completion(rng: random.Random, i: int, run: str = "r1", max_tokens: int = 4096,
               gpus: int = 4, spec: bool = True, reasoning_chars: int = 600,
               content_chars: int = 300) -> Completion:
    tokens, finish = _tokens(rng, max_tokens)
    gpu = i % gpus
    thinking = rng.random() < 0.92
    return Completion(
        id=f"{i:032x}", run=run, settings_hash="0123456789abcdef", prompt=_prompt(rng, i, run),
        finish_reason=finish, content="A" * content_chars,
        reasoning_content="r" * reasoning_chars if thinking else None,
        usage=Usage(prompt_tokens=120, completion_tokens=tokens,
                    reasoning_tokens=tokens // 2 if thinking else 0),
        spec=_spec(rng, gpu, spec), latency_s=12.5, instance=f"gpu{gpu}", model="m")


def conversation(rng: random.Random, i: int, run: str = "r1", max_tokens: int = 4096,
                 gpus: int = 4) -> Conversation:
    steps = []
    for turn in range(1 + int(rng.expovariate(0.7))):
        for call in range(int(rng.expovariate(1.5))):
            steps.append(Step(turn=turn, finish_reason="tool_calls", content="",
                              tool_calls=(ToolCall(FunctionCall("lookup", "{}"), f"c{call}"),),
                              tool_results=(Message("tool", "42"),),
                              usage=Usage(completion_tokens=int(rng.lognormvariate(5, 0.5))),
                              spec=_spec(rng, i % gpus, True), instance=f"gpu{i % gpus}"))
        tokens, finish = _tokens(rng, max_tokens)
        steps.append(Step(turn=turn, finish_reason=finish, content="answer",
                          reasoning_content="think", usage=Usage(completion_tokens=tokens),
                          spec=_spec(rng, i % gpus, True), instance=f"gpu{i % gpus}"))
    users = tuple(Message(role, f"{role} {k}") for k in range(steps[-1].turn + 1)
                  for role in ("user", "assistant"))
    prompt = msgspec.structs.replace(_prompt(rng, i, run), category="multi-turn",
                                     messages=users)
    return Conversation(id=f"{i:032x}", run=run, settings_hash="0123456789abcdef",
                        prompt=prompt, steps=tuple(steps))


def dead_letter(record: Completion | Failure | Conversation, reason: str,
                offset: int) -> DeadLetter:
    return DeadLetter(id=record.id, run=record.run, reason=reason, detail="",
                      source_topic=f"tokenmill.{record.run}.completions", source_partition=0,
                      source_offset=offset, record=record)


def s3_line(record: Completion | Conversation) -> bytes:
    """The line the sink writes for an accepted result (sink/samples.py)."""
    if isinstance(record, Conversation):
        return encode_line(conversation_sample(record))[:-1]
    return sample_line(record)[:-1]


def results(n: int, seed: int = 7, run: str = "r1", max_tokens: int = 4096,
            conversations: float = 0.0, spec: bool = True, failures: float = 0.02,
            **sizes: int) -> Iterator[tuple[bool, bytes]]:
    """(accepted, bytes) per result: an S3 line, or a dead letter's value
    (truncated answers, failures)."""
    rng = random.Random(seed)
    for i in range(n):
        record: Completion | Failure | Conversation
        if rng.random() < conversations:
            record = conversation(rng, i, run, max_tokens)
        elif rng.random() < failures:
            record = Failure(id=f"{i:032x}", run=run, settings_hash="0123456789abcdef",
                             prompt=_prompt(rng, i, run), failure="timeout", error="timed out")
            yield False, _encoder.encode(dead_letter(record, "failed", i))
            continue
        else:
            record = completion(rng, i, run, max_tokens, spec=spec, **sizes)
            if record.finish_reason == "length":
                yield False, _encoder.encode(dead_letter(record, "length", i))
                continue
        yield True, s3_line(record)


def progress(run: str = "r1", gpus: int = 4, seconds: int = 3600, every: float = 5.0,
             total: int = 1000, seed: int = 7) -> Iterator[ProducerCheckpoint | ConsumerProgress]:
    """What the progress topic holds: a producer checkpoint, then each GPU's
    cumulative counters every `every` seconds (a slow start, a dip)."""
    rng = random.Random(seed)
    t0 = 1_700_000_000.0
    yield ProducerCheckpoint(run=run, next_seq=total, total=total, done=True, updated_at=t0)
    done = [0.0] * gpus
    tokens = [0.0] * gpus
    accept = [2.6 + 0.3 * g for g in range(gpus)]
    steps = int(seconds / every)
    for k in range(1, steps + 1):
        t = t0 + k * every
        for g in range(gpus):
            ramp = min(1.0, k / 20) * (0.6 if steps // 2 < k < steps // 2 + 30 else 1.0)
            rate = ramp * (2400 + 200 * g) * rng.uniform(0.85, 1.15)
            tokens[g] += rate * every
            done[g] = min(total / gpus, done[g] + rate * every / 1800)
            yield ConsumerProgress(run=run, instance=f"gpu{g}", completions=int(done[g]),
                                   completion_tokens=int(tokens[g]), started_at=t0,
                                   updated_at=t, spec_tokens=int(tokens[g]),
                                   spec_accept_weighted=accept[g] * int(tokens[g]))
