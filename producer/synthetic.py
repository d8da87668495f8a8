"""Synthetic mixed prompt datasets for tests and benchmarks (not used when
producing): ShareGPT single- and multi-turn, OpenAI messages with and without
system prompts, OpenAI tool calls with tool results, Hermes function calling,
Alpaca and plain prompts, in the proportions of the seed run's dataset
(about 12% tools, 8% multi-turn). Every record is unique, so nothing is
deduplicated away unless asked for.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

WORDS = [
    "the", "model", "server", "queue", "token", "batch", "prompt", "answer", "reason", "think",
    "step", "check", "value", "table", "python", "kafka", "cluster", "partition", "offset",
    "commit", "transaction", "record", "stream", "memory", "latency", "compute", "gradient",
    "drafter", "speculative", "decode", "accept", "length", "verify", "cache", "layer", "weight",
    "explain", "write", "describe", "compare", "list", "summarize", "translate", "prove", "derive",
    "optimize", "debug", "function", "class", "module", "test", "error", "result", "input",
    "output", "file", "path", "number", "string", "matrix", "city", "weather", "price", "stock",
    "flight", "hotel", "recipe", "ingredient", "distance", "time", "date", "currency"
]

KINDS: tuple[tuple[str, float], ...] = (
    ("sharegpt", 0.30), ("sharegpt-multi", 0.08), ("openai", 0.15), ("openai-system", 0.10),
    ("openai-tools", 0.08), ("hermes", 0.045), ("alpaca", 0.10), ("prompt", 0.145),
)

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


def _text(rng: random.Random, n: int, serial: int) -> str:
    words = rng.choices(WORDS, k=n)
    return f"[{serial}] " + " ".join(words) + "?"


def record(kind: str, serial: int, rng: random.Random, words: int = 60) -> dict[str, Any]:
    """One dataset record of the given kind; `serial` makes it unique."""
    q = _text(rng, words, serial)
    a = _text(rng, words * 2, serial)
    if kind == "sharegpt":
        return {"conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}]}
    if kind == "sharegpt-multi":
        return {"conversations": [
            {"from": "system", "value": "You are a careful assistant."},
            {"from": "human", "value": q}, {"from": "gpt", "value": a},
            {"from": "human", "value": _text(rng, words // 2, serial)},
            {"from": "gpt", "value": a}]}
    if kind == "openai":
        return {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
    if kind == "openai-system":
        return {"messages": [{"role": "system", "content": "Answer briefly and exactly."},
                             {"role": "user", "content": q}]}
    if kind == "openai-tools":
        return {"messages": [
            {"role": "user", "content": f"What is the weather in city {serial}? {q}"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": f'{{"city": "c{serial}"}}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21}'},
            {"role": "assistant", "content": "It is 21 C."},
            {"role": "user", "content": "And tomorrow?"}],
            "tools": [WEATHER_TOOL]}
    if kind == "hermes":
        tools = msgspec.json.encode([WEATHER_TOOL]).decode()
        return {"conversations": [
            {"from": "system", "value": "You are a function calling AI model. Here are the "
                                        f"available tools: <tools> {tools} </tools>"},
            {"from": "human", "value": q},
            {"from": "gpt", "value": f'<tool_call>\n{{"name": "get_weather", "arguments": '
                                     f'{{"city": "c{serial}"}}}}\n</tool_call>'}]}
    if kind == "alpaca":
        return {"instruction": q, "input": _text(rng, words // 3, serial), "output": a}
    return {"prompt": q}


def records(n: int, seed: int = 0, kinds: tuple[tuple[str, float], ...] = KINDS,
            words: int = 60) -> Iterator[dict[str, Any]]:
    rng = random.Random(seed)
    names = [k for k, _ in kinds]
    weights = [w for _, w in kinds]
    for serial in range(n):
        yield record(rng.choices(names, weights)[0], serial, rng, words)


def write_jsonl(path: Path, items: Iterator[dict[str, Any]] | list[dict[str, Any]]) -> int:
    """Write records as JSONL; returns the count."""
    encoder = msgspec.json.Encoder()
    count = 0
    with path.open("wb", buffering=1 << 20) as fh:
        for item in items:
            fh.write(encoder.encode(item) + b"\n")
            count += 1
    return count
