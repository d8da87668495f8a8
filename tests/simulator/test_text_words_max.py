"""`text_words_max`: short text, the full answer's tokens, timing and finish."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from sglang_sim.answers import first_words
from tests.simulator.sim_helpers import chat

pytestmark = pytest.mark.timeout(60)

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


def test_first_words() -> None:
    assert first_words("a b c d", 2) == "a b"
    assert first_words("a b", 5) == "a b"
    assert first_words("", 3) == ""


def _answers(url: str, body: dict[str, Any], n: int) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        status, answer = chat(url, {**body, "messages": [{"role": "user", "content": f"Q {i}?"}]})
        assert status == 200
        out.append(answer)
    return out


def test_short_text_keeps_the_full_answers_usage_and_finish(
        simulator: Callable[..., str]) -> None:
    full, short = simulator(zero_delay=True), simulator(zero_delay=True, text_words_max=5)
    body = {"model": "m", "max_tokens": 4096}
    for a, b in zip(_answers(full, body, 30), _answers(short, body, 30), strict=True):
        assert a["usage"] == b["usage"]
        ca, cb = a["choices"][0], b["choices"][0]
        assert ca["finish_reason"] == cb["finish_reason"]
        for field in ("reasoning_content", "content"):
            full_text, short_text = ca["message"][field] or "", cb["message"][field] or ""
            assert full_text.startswith(short_text)
            assert len(short_text.split()) <= 5


def test_a_tool_call_stays_whole(simulator: Callable[..., str]) -> None:
    url = simulator(zero_delay=True, text_words_max=3, tool_call_parser="qwen25",
                    tool_call_rate=1.0)
    body = {"model": "m", "max_tokens": 20000, "tools": [WEATHER_TOOL]}
    calls = [a["choices"][0] for a in _answers(url, body, 10)]
    assert all(c["finish_reason"] == "tool_calls" for c in calls)
    assert all(c["message"]["tool_calls"][0]["function"]["name"] == "get_weather" for c in calls)
