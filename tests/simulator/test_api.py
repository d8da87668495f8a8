"""The HTTP surface against a running simulator: the openai SDK and raw bodies."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import openai
import pytest

from tests.simulator.sim_helpers import chat, http, metric_values, user

pytestmark = pytest.mark.timeout(60)

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"},
                           "unit": {"type": "string", "enum": ["c", "f"]},
                           "days": {"type": "integer"}},
            "required": ["city", "unit"],
        },
    },
}


def sdk(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


# ------------------------------------------------------------- the openai SDK


def test_sdk_plain_chat_with_reasoning(fast_url: str) -> None:
    r = sdk(fast_url).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Why is the sky blue?"}],
        max_tokens=20000)
    choice = r.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.content  # the answer after </think>
    reasoning = (choice.message.model_extra or {}).get("reasoning_content")
    assert reasoning and "<think>" not in reasoning and "<think>" not in choice.message.content
    assert (choice.model_extra or {}).get("matched_stop") == 151645
    assert r.usage is not None
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert 0 < (r.usage.model_extra or {})["reasoning_tokens"] < r.usage.completion_tokens


def test_sdk_length_cut_off(fast_url: str) -> None:
    r = sdk(fast_url).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Write a long essay."}], max_tokens=50)
    choice = r.choices[0]
    assert choice.finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == 50
    # cut inside the thinking: everything is reasoning, the content is empty
    assert choice.message.content == ""
    assert (choice.message.model_extra or {})["reasoning_content"]


def test_sdk_parses_tool_calls(fast_url: str) -> None:
    import json

    r = sdk(fast_url).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER_TOOL], tool_choice="required", max_tokens=30000)  # type: ignore[list-item]
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls and calls[0].function.name == "get_weather"
    assert calls[0].id.startswith("call_")
    args = json.loads(calls[0].function.arguments)
    assert set(args) >= {"city", "unit"} and args["unit"] in ("c", "f")
    assert "<tool_call>" not in (choice.message.content or "")


def test_sdk_bad_request_for_too_long_prompt(fast_url: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        sdk(fast_url).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x" * 200_000}], max_tokens=10)
    assert err.value.status_code == 400
    assert "longer than the model's context length (32768 tokens)" in str(err.value)


def test_sdk_streaming_matches_non_streaming(fast_url: str) -> None:
    client = sdk(fast_url)
    messages = [{"role": "user", "content": "Stream me something."}]
    full = client.chat.completions.create(model="m", messages=messages,  # type: ignore[arg-type]
                                          max_tokens=300)
    stream = client.chat.completions.create(model="m", messages=messages,  # type: ignore[arg-type]
                                            max_tokens=300, stream=True,
                                            stream_options={"include_usage": True})
    reasoning, content, finish, usage = "", "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            reasoning += (c.delta.model_extra or {}).get("reasoning_content") or ""
            content += c.delta.content or ""
            finish = c.finish_reason or finish
    assert reasoning == (full.choices[0].message.model_extra or {}).get("reasoning_content")
    assert content == (full.choices[0].message.content or "")
    assert finish == full.choices[0].finish_reason
    assert usage is not None and full.usage is not None
    assert usage.completion_tokens == full.usage.completion_tokens


# ------------------------------------------------------------- response shapes


def test_rid_meta_info_and_spec_stats(fast_url: str) -> None:
    status, body = chat(fast_url, user("meta please", rid="req-42", return_meta_info=True,
                                       max_tokens=4000))
    assert status == 200 and body["id"] == "req-42"
    choice = body["choices"][0]
    meta = choice["meta_info"]
    assert meta["id"] == "req-42"
    assert meta["completion_tokens"] == body["usage"]["completion_tokens"]
    assert meta["prompt_tokens"] == body["usage"]["prompt_tokens"]
    assert meta["spec_verify_ct"] > 0
    assert meta["spec_accept_length"] == pytest.approx(
        meta["completion_tokens"] / meta["spec_verify_ct"])
    assert 1.0 <= meta["spec_accept_length"] <= 4.0
    assert meta["finish_reason"]["type"] == choice["finish_reason"]
    assert body["metadata"] == {"weight_version": "default"}
    # without return_meta_info the field is absent, as in SGLang
    _, plain = chat(fast_url, user("meta please"))
    assert "meta_info" not in plain["choices"][0]


def test_same_prompt_same_text_and_seed_changes_it(fast_url: str) -> None:
    _, a = chat(fast_url, user("determinism", max_tokens=500))
    _, b = chat(fast_url, user("determinism", max_tokens=500))
    _, c = chat(fast_url, user("determinism", max_tokens=500, seed=7))
    ma, mb, mc = (x["choices"][0]["message"] for x in (a, b, c))
    assert ma == mb
    assert ma != mc


def test_thinking_off_gives_no_reasoning(fast_url: str) -> None:
    _, body = chat(fast_url, user("no thinking", max_tokens=8000,
                                  chat_template_kwargs={"enable_thinking": False}))
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] is None
    assert message["content"] and "<think>" not in message["content"]
    assert body["usage"]["reasoning_tokens"] == 0


def test_stop_string(fast_url: str) -> None:
    _, full = chat(fast_url, user("stop test", max_tokens=30000,
                                  chat_template_kwargs={"enable_thinking": False}))
    word = full["choices"][0]["message"]["content"].split()[5]
    _, cut = chat(fast_url, user("stop test", max_tokens=30000, stop=[word],
                                 chat_template_kwargs={"enable_thinking": False}))
    choice = cut["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["matched_stop"] == word
    assert word not in choice["message"]["content"]
    assert cut["usage"]["completion_tokens"] < full["usage"]["completion_tokens"]


def test_cache_report_counts_a_shared_prefix(fast_url: str) -> None:
    system = {"role": "system", "content": "You are a careful assistant. " * 40}
    first = {"model": "m", "messages": [system, {"role": "user", "content": "one"}]}
    second = {"model": "m", "messages": [system, {"role": "user", "content": "two"}]}
    _, a = chat(fast_url, first)
    _, b = chat(fast_url, second)
    assert (a["usage"]["prompt_tokens_details"] or {}).get("cached_tokens", 0) == 0
    cached = b["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached < b["usage"]["prompt_tokens"]


def test_raw_tool_call_text_without_a_parser(simulator: Callable[..., str]) -> None:
    url = simulator(zero_delay=True)  # no --tool-call-parser
    _, body = chat(url, user("weather", tools=[WEATHER_TOOL], tool_choice="required",
                             max_tokens=30000))
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["matched_stop"] == 151645
    assert choice["message"]["tool_calls"] is None
    assert "<tool_call>" in choice["message"]["content"]
    assert '"name": "get_weather"' in choice["message"]["content"]


def test_no_reasoning_parser_keeps_think_tags(simulator: Callable[..., str]) -> None:
    url = simulator(zero_delay=True, reasoning_parser=None, empty_content="null")
    _, body = chat(url, user("raw", max_tokens=20000))
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] is None
    assert message["content"].startswith("<think>\n") and "</think>" in message["content"]


def test_tool_call_rate(simulator: Callable[..., str]) -> None:
    url = simulator(zero_delay=True, tool_call_parser="qwen25", tool_call_rate=0.3)
    calls = 0
    for i in range(200):
        _, body = chat(url, user(f"maybe a tool {i}", tools=[WEATHER_TOOL], max_tokens=30000))
        calls += body["choices"][0]["finish_reason"] == "tool_calls"
    assert 40 <= calls <= 80


# ------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("body", "err_type", "fragment"),
    [
        ({"model": "m"}, "Bad Request", "messages"),
        ({"messages": "hello"}, "Bad Request", "Expected `array`"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "Bad Request", "role"),
        ({"messages": []}, "BadRequestError", "Messages cannot be empty."),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": "many"}, "Bad Request",
         "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 40000},
         "BadRequestError", "max_completion_tokens is too large: 40000."),
        ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"},
         "BadRequestError", "Tools cannot be empty if tool choice is set to required."),
    ],
)
def test_validation_errors(fast_url: str, body: dict[str, Any], err_type: str,
                           fragment: str) -> None:
    status, err = chat(fast_url, body)
    assert status == 400
    assert set(err) == {"object", "message", "type", "param", "code"}
    assert err["object"] == "error" and err["code"] == 400 and err["param"] is None
    assert err["type"] == err_type
    assert fragment in err["message"]


def test_context_length_error_text(fast_url: str) -> None:
    status, err = chat(fast_url, user("y" * 100_000, max_tokens=10000))
    assert status == 400 and err["type"] == "BadRequestError"
    prompt = 25000 + 4 + 3  # ceil(100000 / 4) + message overhead + generation prompt
    assert err["message"] == (
        "Requested token count exceeds the model's maximum context length of 32768 tokens. "
        f"You requested a total of {prompt + 10000} tokens: {prompt} tokens from the input "
        "messages and 10000 tokens for the completion. Please reduce the number of tokens in "
        "the input messages or the completion to fit within the limit.")


def test_unknown_sglang_extras_are_accepted(fast_url: str) -> None:
    status, body = chat(fast_url, user("extras", top_k=20, min_p=0.0, temperature=0.6,
                                       top_p=0.95, separate_reasoning=True, seed=3, n=1,
                                       repetition_penalty=1.05, some_future_field={"a": 1},
                                       max_tokens=64))
    assert status == 200 and body["choices"][0]["finish_reason"] in ("stop", "length")


# ------------------------------------------------------------- info routes


def test_info_routes(simulator: Callable[..., str]) -> None:
    url = simulator(zero_delay=True, served_model_name="qwen3-sim", context_length=8192)
    assert http("GET", url + "/health") == (200, None)
    assert http("GET", url + "/health_generate") == (200, None)
    _, models = http("GET", url + "/v1/models")
    assert models["object"] == "list"
    assert models["data"][0]["id"] == "qwen3-sim"
    assert models["data"][0]["max_model_len"] == 8192
    assert models["data"][0]["owned_by"] == "sglang"
    _, info = http("GET", url + "/get_model_info")
    assert info["model_path"] == "Qwen/Qwen3-8B" and info["is_generation"] is True
    _, server = http("GET", url + "/get_server_info")
    assert server["context_length"] == 8192 and server["version"]
    assert openai.OpenAI(base_url=url + "/v1", api_key="x").models.list().data[0].id == "qwen3-sim"


def test_metrics_match_the_traffic(simulator: Callable[..., str]) -> None:
    url = simulator(zero_delay=True)
    prompt = completion = 0
    for i in range(25):
        status, body = chat(url, user(f"count me {i}", max_tokens=3000))
        assert status == 200
        prompt += body["usage"]["prompt_tokens"]
        completion += body["usage"]["completion_tokens"]
    chat(url, {"messages": []})  # a 400 is not a processed request
    m = metric_values(url)
    assert m["sglang:num_requests_total"] == 25
    assert m["sglang:prompt_tokens_total"] == prompt
    assert m["sglang:generation_tokens_total"] == completion
    assert m["sglang:num_running_reqs"] == 0 and m["sglang:num_queue_reqs"] == 0
    assert m["sglang:e2e_request_latency_seconds_count"] == 25
    _, text = http("GET", url + "/metrics")
    assert 'sglang:num_running_reqs{engine_type="unified",model_name="Qwen/Qwen3-8B"' in text
    assert "# TYPE sglang:generation_tokens_total counter" in text


def test_history_with_assistant_tool_calls_and_tool_results_is_accepted(fast_url) -> None:
    """Multi-turn tool conversations send earlier tool calls back (SGLang accepts them)."""
    body = {"model": "m", "max_tokens": 16, "messages": [
        {"role": "user", "content": "weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 3}"},
        {"role": "user", "content": "and tomorrow?"}]}
    status, response = chat(fast_url, body)
    assert status == 200, response
    assert response["choices"][0]["finish_reason"] in ("stop", "length")
