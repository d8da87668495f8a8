"""regenerate-turns through tool calls, on the real broker with the
simulator: recorded results are spliced in and the conversation goes on; a
call the dataset cannot answer ends it as `tool_unresolved` unless the
`--tool-results` hook answers it; malformed arguments, unknown functions and
schema violations are dead-lettered as `invalid_tool_call`."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from devstack.processes import free_port
from schemas import Conversation, decode_completion
from sglang_sim import SimulatorConfig
from sglang_sim.runner import SimulatorProcess
from tests.dataset.test_lineage_e2e import generate
from tests.e2e.test_regenerate_turns import produce, s3_lines, stack_env
from tests.kafka_helpers import read_all

pytestmark = [pytest.mark.broker, pytest.mark.s3, pytest.mark.slow]

# One city the simulator can pick: its calls are predictable, so the dataset
# can hold (or miss) the result of exactly the call the model makes.
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "enum": ["Paris"]}}, "required": ["city"]}}}
GROUPS = ("dataset", "missing", "hook")


def write_tool_chats(path: Path, n: int) -> None:
    """Two user turns; the dataset called get_weather in turn 0 for Paris
    (`dataset`) or for Rome (`missing`, `hook`: the model's Paris call has no
    recorded result)."""
    with path.open("w") as f:
        for i in range(n):
            group = GROUPS[i % 3]
            city = "Paris" if group == "dataset" else "Rome"
            marker = " [hook]" if group == "hook" else ""
            call = {"id": f"call{i}", "type": "function", "function": {
                "name": "get_weather", "arguments": json.dumps({"city": city})}}
            f.write(json.dumps({"tools": [WEATHER], "messages": [
                {"role": "user", "content": f"Chat {i} ({group}){marker}: weather?"},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": f"call{i}", "content": f"sunny in {city} {i}"},
                {"role": "assistant", "content": "It is sunny."},
                {"role": "user", "content": f"Chat {i}: and tomorrow?"},
                {"role": "assistant", "content": "Also sunny."}]}) + "\n")


def run(settings: Any, run_id: str, tmp_path: Path, sim: SimulatorConfig, *produce_args: str
        ) -> tuple[list[Any], list[dict[str, Any]], list[Any]]:
    env = stack_env(settings, tmp_path)
    dataset = tmp_path / "tools.jsonl"
    write_tool_chats(dataset, 90)
    produce(env, tmp_path, dataset, run_id, "--gpus", "1", *produce_args)
    simulator = SimulatorProcess(sim, port=free_port())
    url = simulator.start()
    try:
        generate(env, tmp_path, run_id, url)
    finally:
        simulator.terminate()
    records = [decode_completion(r.value) for r in
               read_all(settings.bootstrap_servers, f"tokenmill.{run_id}.completions")]
    dlq = read_all(settings.bootstrap_servers, f"tokenmill.{run_id}.dlq")
    assert len(records) == len({r.id for r in records}) == 90
    return records, s3_lines(settings), dlq


def group_of(record: Any) -> str:
    return next(g for g in GROUPS if f"({g})" in record.prompt.messages[0].content)


def test_tool_results_are_spliced_in_or_end_the_conversation(settings, services, run_id,
                                                            tmp_path) -> None:
    records, lines, dlq = run(
        settings, run_id, tmp_path,
        SimulatorConfig(time_scale=1000, prefill_rate=0, length_median=300, length_max=1000,
                        tool_call_parser="qwen25", tool_call_rate=0.5),
        "--tool-results", "tests.e2e.tool_hooks:answer")
    assert all(isinstance(r, Conversation) for r in records)
    calls_per_conversation: Counter[int] = Counter()
    answered_in: Counter[str] = Counter()
    for r in records:
        group = group_of(r)
        tool_steps = [s for s in r.steps if s.tool_calls]
        calls_per_conversation[len(tool_steps)] += 1
        answered = [s for s in tool_steps if s.tool_results]
        answered_in[group] += len(answered)
        if group == "missing" and tool_steps:
            assert r.outcome == "tool_unresolved" and not answered and r.steps[-1].tool_calls
            continue
        assert r.outcome in ("finished", "tool_limit"), (group, r.outcome)
        # Every call answered and the conversation went on (past the round limit: stopped).
        assert answered == (tool_steps[:-1] if r.outcome == "tool_limit" else tool_steps)
        want = f"sunny in Paris {r.prompt.messages[0].content.split()[1]}" \
            if group == "dataset" else "hook: Paris"
        assert {m.content for s in answered for m in s.tool_results} <= {want}
        if r.outcome == "finished":
            assert [s.turn for s in r.steps][-1] == 1 and not r.steps[-1].tool_calls
    assert {1, 2, 3} <= set(calls_per_conversation), calls_per_conversation
    assert answered_in["dataset"] > 0 and answered_in["hook"] > 0 and not answered_in["missing"]
    outcomes = Counter(r.outcome for r in records)
    assert outcomes["tool_unresolved"] > 0 and outcomes["finished"] > 0
    assert len(lines) + len(dlq) == 90


def test_invalid_tool_calls_are_dead_lettered(settings, services, run_id, tmp_path) -> None:
    records, lines, dlq = run(
        settings, run_id, tmp_path,
        SimulatorConfig(time_scale=1000, prefill_rate=0, length_median=300, length_max=1000,
                        tool_call_parser="qwen25", tool_call_rate=1.0,
                        malformed_tool_call_rate=0.34, unknown_tool_call_rate=0.33,
                        invalid_tool_arguments_rate=0.33))
    assert lines == []
    reasons = Counter(dict(r.headers)["tokenmill.dlq.reason"].decode() for r in dlq)
    assert reasons == {"invalid_tool_call": 90}
    details = [dict(r.headers)["tokenmill.dlq.detail"].decode() for r in dlq]
    for kind in ("arguments are not JSON", "not one of the offered tools",
                 "arguments violate its schema"):
        assert any(kind in d for d in details), kind
    assert all(d.startswith("step 0: ") for d in details)
