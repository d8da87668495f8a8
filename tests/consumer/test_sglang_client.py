import msgspec
import pytest

from consumer.sglang_client import (
    PromptRejected,
    Retryable,
    ServerMisconfigured,
    ServerRefused,
    ServerUnavailable,
    SGLangClient,
    classify_status,
    error_message,
    parse_response,
    request_body,
)
from schemas import GenerationSettings, Message, PromptRecord
from sglang_sim import SimulatorConfig, running_simulator

PROMPT = PromptRecord(id="abc", run="r", messages=(Message(role="system", content="be brief"),
                                                   Message(role="user", content="hi")),
                      source="s", format="openai", category="system-prompt",
                      tools=({"type": "function", "function": {"name": "f", "parameters": {}}},))


def test_request_body_carries_run_settings() -> None:
    body = request_body(PROMPT, GenerationSettings(model="m", max_tokens=4096, temperature=0.6,
                                                   top_p=0.95, top_k=20, seed=7,
                                                   enable_thinking=False))
    assert body["model"] == "m"
    assert body["max_tokens"] == 4096
    assert body["top_k"] == 20 and body["seed"] == 7
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert body["return_meta_info"] is True
    assert body["rid"] == "abc"
    assert body["messages"] == [{"role": "system", "content": "be brief"},
                                {"role": "user", "content": "hi"}]
    assert body["tools"][0]["function"]["name"] == "f"
    assert request_body(PROMPT, GenerationSettings(), attempt=3)["rid"] == "abc.3"


def test_parse_sglang_response_with_extras() -> None:
    payload = msgspec.json.encode({
        "id": "abc", "model": "Qwen", "choices": [{
            "index": 0, "finish_reason": "stop", "matched_stop": 151645,
            "message": {"role": "assistant", "content": "4", "reasoning_content": "2+2"},
            "meta_info": {"spec_accept_length": 3.1, "spec_verify_ct": 10,
                          "spec_draft_token_num": 40, "spec_accept_token_num": 21}}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 31, "reasoning_tokens": 20,
                  "prompt_tokens_details": {"cached_tokens": 8}}})
    result = parse_response(payload, 0.5)
    assert (result.content, result.reasoning_content, result.finish_reason) == ("4", "2+2", "stop")
    assert result.matched_stop == 151645
    assert result.usage.reasoning_tokens == 20 and result.usage.cached_tokens == 8
    assert result.spec.accept_length == 3.1 and result.spec.verify_ct == 10


def test_parse_plain_openai_response_without_extras() -> None:
    payload = msgspec.json.encode({
        "choices": [{"finish_reason": "tool_calls", "message": {
            "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                "name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 9,
                  "completion_tokens_details": {"reasoning_tokens": 4}}})
    result = parse_response(payload, 0.1)
    assert result.tool_calls[0].function.name == "get_weather"
    assert result.usage.reasoning_tokens == 4 and result.usage.cached_tokens == 0
    assert result.spec.accept_length is None and result.matched_stop is None


def test_abort_and_garbage_are_retryable() -> None:
    abort = msgspec.json.encode({"choices": [{"finish_reason": "abort", "message": {}}]})
    with pytest.raises(Retryable) as caught:
        parse_response(abort, 0.1)
    assert caught.value.kind == "abort"
    with pytest.raises(Retryable):
        parse_response(b"<html>", 0.1)


@pytest.mark.parametrize(("status", "message", "expected", "kind"), [
    (400, "Requested token count exceeds the model's maximum context length of 32768 tokens.",
     PromptRejected, "prompt_too_long"),
    (400, "The input (40000 tokens) is longer than the model's context length (32768 tokens).",
     PromptRejected, "prompt_too_long"),
    (400, "Messages cannot be empty.", PromptRejected, "bad_request"),
    (500, "boom", Retryable, "server_error"),
    (502, "bad gateway", Retryable, "server_error"),
    (503, "loading", ServerUnavailable, None),
    (401, "bad key", ServerMisconfigured, None),
    (404, "model not found", ServerRefused, "server_error"),
    (405, "method not allowed", ServerRefused, "server_error"),
    (501, "not implemented", ServerRefused, "server_error"),
])
def test_status_taxonomy(status, message, expected, kind) -> None:
    error = classify_status(status, message)
    assert isinstance(error, expected)
    if kind:
        assert error.kind == kind


def test_error_message_from_openai_error_bodies() -> None:
    assert error_message(b'{"object":"error","message":"too long","type":"BadRequestError",'
                         b'"param":null,"code":400}') == "too long"
    assert error_message(b'{"error":{"message":"nope","type":"x"}}') == "nope"
    assert error_message(b"plain text") == "plain text"


async def test_against_the_simulator() -> None:
    with running_simulator(SimulatorConfig(zero_delay=True, context_length=1000,
                                           speculative_accept_length=3.0)) as url:
        async with SGLangClient(url) as client:
            assert await client.healthy()
            result = await client.chat(request_body(PROMPT, GenerationSettings(max_tokens=64)))
            assert result.usage.completion_tokens <= 64
            assert result.finish_reason in ("stop", "length", "tool_calls")
            assert result.spec.verify_ct
            long_prompt = PromptRecord(id="long", run="r", source="s", format="plain",
                                       category="plain",
                                       messages=(Message(role="user", content="x " * 5000),))
            with pytest.raises(PromptRejected) as rejected:
                await client.chat(request_body(long_prompt, GenerationSettings(max_tokens=64)))
            assert rejected.value.kind == "prompt_too_long"
            assert "sglang:num_running_reqs" in (await client.metrics_text() or "")
            # --concurrency auto starts at the server's own limit
            assert await client.max_running_requests() == SimulatorConfig().max_running_requests


async def test_side_endpoints_of_a_dead_server_answer_none() -> None:
    from devstack.processes import free_port

    async with SGLangClient(f"http://127.0.0.1:{free_port()}") as client:
        assert await client.healthy() is False
        assert await client.metrics_text() is None
        assert await client.max_running_requests() is None
