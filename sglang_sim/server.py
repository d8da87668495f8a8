"""The aiohttp app: SGLang's HTTP surface backed by the simulator's models.

Routes: ``POST /v1/chat/completions`` (JSON or SSE), ``GET /health``,
``/health_generate``, ``/v1/models``, ``/get_model_info``,
``/get_server_info`` (also ``/server_info``) and ``/metrics``.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import msgspec
from aiohttp import web

from sglang_sim import answers
from sglang_sim.capacity import Scheduler
from sglang_sim.config import SimulatorConfig
from sglang_sim.faults import FaultInjector, Transient, unit
from sglang_sim.lengths import LengthModel
from sglang_sim.metrics import CONTENT_TYPE, MetricsEndpoint, RequestStats, SGLangCollector
from sglang_sim.prompts import PrefixCache, facts, thinking_enabled
from sglang_sim.protocol import (
    ENCODER,
    REQUEST_DECODER,
    VALID_ROLES,
    ChatCompletionChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionStreamResponse,
    ChatMessage,
    DeltaMessage,
    FunctionResponse,
    ModelCard,
    ModelList,
    PromptTokensDetails,
    StreamChoice,
    ToolCall,
    UsageInfo,
    error_body,
)
from sglang_sim.textgen import corpus_for
from tokenmill.log import get_logger

log = get_logger("sglang_sim")

CRASH_EXIT_CODE = 86
JSON = "application/json"
STREAM_PIECES = 16


def _default_crash() -> None:
    """Die like a GPU server whose process is killed: no response, no cleanup."""
    print("tokenmill sim-sglang: crash_after reached, exiting hard", file=sys.stderr, flush=True)
    os._exit(CRASH_EXIT_CODE)


class SimulatorState:
    """Everything one simulated server keeps between requests."""

    def __init__(self, config: SimulatorConfig, crash_hook: Callable[[], None]) -> None:
        self.config = config
        self.crash_hook = crash_hook
        self.scheduler = Scheduler(config)
        self.stats = RequestStats()
        self.faults = FaultInjector(config)
        self.cache = PrefixCache()
        self.lengths = LengthModel(config.length_median, config.length_sigma,
                                   config.length_min, config.length_max)
        self.corpus = corpus_for(max(config.length_max, config.context_length))
        self.collector = SGLangCollector(config, self.scheduler, self.stats)
        self.metrics = MetricsEndpoint(self.collector)
        self.started_at = time.monotonic()
        self.tool_parser = config.tool_call_parser not in (None, "", "none")
        self.reasoning_parser = config.reasoning_parser not in (None, "", "none")
        # Line-buffered: every request is on disk when the response leaves.
        self.request_log = (open(config.request_log, "a", buffering=1, encoding="utf-8")
                            if config.request_log else None)

    def log_request(self, body: bytes) -> None:
        """One JSONL line per chat request: what it asked and when it came
        (`at`, Unix seconds), for tests to check."""
        if self.request_log is None:
            return
        try:
            request = json.loads(body)
        except ValueError:
            return
        if isinstance(request, dict):
            line = {"rid": request.get("rid"), "messages": request.get("messages"),
                    "at": time.time()}
            self.request_log.write(json.dumps(line, ensure_ascii=False) + "\n")

    def warming(self) -> bool:
        return time.monotonic() - self.started_at < self.config.warmup_seconds


STATE = web.AppKey("tokenmill_simulator", SimulatorState)


def _json(body: bytes, status: int = 200) -> web.Response:
    return web.Response(body=body, status=status, content_type=JSON)


def _error(message: str, err_type: str = "BadRequestError", code: int = 400) -> web.Response:
    return _json(error_body(message, err_type, code), status=code)


# ------------------------------------------------------------------ validation


class RequestError(Exception):
    def __init__(self, message: str, err_type: str = "BadRequestError", code: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.err_type = err_type
        self.code = code


def parse_request(body: bytes) -> ChatCompletionRequest:
    """Decode and validate a chat request the way SGLang's pydantic model would."""
    try:
        request = REQUEST_DECODER.decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        # SGLang turns pydantic's RequestValidationError into a 400 "Bad Request"
        raise RequestError(f"1 validation error for ChatCompletionRequest: {exc}",
                           "Bad Request") from exc
    for i, message in enumerate(request.messages):
        if message.role.lower() not in VALID_ROLES:
            raise RequestError(
                f"1 validation error for ChatCompletionRequest: messages.{i}.role: "
                f"Input should be 'system', 'assistant', 'tool', 'function', 'developer' "
                f"or 'user'", "Bad Request")
        if message.role == "user" and message.content is None:
            raise RequestError(
                f"1 validation error for ChatCompletionRequest: messages.{i}.content: "
                "Field required", "Bad Request")
    if not request.messages:
        raise RequestError("Messages cannot be empty.")
    tool_choice = request.tool_choice
    if tool_choice == "required" and not request.tools:
        raise RequestError("Tools cannot be empty if tool choice is set to required.")
    if isinstance(tool_choice, dict):
        if not request.tools:
            raise RequestError("Tools cannot be empty if tool choice is set to a specific tool.")
        name = (tool_choice.get("function") or {}).get("name")
        if not any(t.function.name == name for t in request.tools):
            raise RequestError(f"Tool '{name}' not found in tools list.")
    if request.stream and request.return_meta_info:
        raise RequestError("return_meta_info is not supported with streaming. "
                           "Please set stream=false when using return_meta_info=true.")
    if request.n < 1:
        raise RequestError(f"n must be at least 1, got {request.n}.")
    return request


def check_lengths(config: SimulatorConfig, prompt_tokens: int, max_new: int | None) -> None:
    """SGLang's length checks (serving_chat._validate_request, tokenizer_manager)."""
    if max_new is not None and max_new < 0:
        raise RequestError(f"max_new_tokens must be at least 0, got {max_new}.")
    ctx = config.context_length
    if max_new is not None and max_new > ctx:
        raise RequestError(f"max_completion_tokens is too large: {max_new}."
                           f"This model supports at most {ctx} completion tokens.")
    if prompt_tokens >= ctx:
        raise RequestError(f"The input ({prompt_tokens} tokens) is longer than the model's "
                           f"context length ({ctx} tokens).")
    if max_new is not None and max_new + prompt_tokens >= ctx:
        raise RequestError(
            "Requested token count exceeds the model's maximum context length "
            f"of {ctx} tokens. You requested a total of {max_new + prompt_tokens} "
            f"tokens: {prompt_tokens} tokens from the input messages and "
            f"{max_new} tokens for the completion. Please reduce the number "
            "of tokens in the input messages or the completion to fit within the limit.")


# ------------------------------------------------------------------ responses


def finish_dict(c: answers.Completion, finish: str, matched: int | str | None) -> dict[str, Any]:
    """meta_info.finish_reason as SGLang's BaseFinishReason.to_json() gives it."""
    if finish == "length":
        return {"type": "length", "length": c.completion_tokens}
    if finish == "abort":
        return {"type": "abort", "message": "Request aborted (simulated fault)",
                "status_code": None, "err_type": None}
    return {"type": finish, "matched": matched}


def spec_meta(config: SimulatorConfig, completion_tokens: int, u: float) -> dict[str, Any]:
    """Per-request speculative stats (tokenizer_manager._calculate_spec_decoding_metrics)."""
    guess = config.speculative_num_draft_tokens - 1
    target = config.speculative_accept_length * (0.85 + 0.3 * u)
    target = min(max(target, 1.0), float(config.speculative_num_draft_tokens))
    verify_ct = math.ceil(completion_tokens / target) if completion_tokens > 0 else 0
    meta: dict[str, Any] = {"spec_accept_rate": 0.0, "spec_accept_length": 0,
                            "spec_verify_ct": verify_ct}
    if verify_ct > 0 and guess > 0:
        drafts = verify_ct * guess
        accepted = completion_tokens - verify_ct
        meta.update(spec_accept_rate=accepted / drafts,
                    spec_accept_length=completion_tokens / verify_ct,
                    spec_accept_token_num=accepted, spec_draft_token_num=drafts)
    return meta


class Parsed(msgspec.Struct, kw_only=True):
    """A completion after SGLang's reasoning and tool-call parsers."""

    reasoning: str | None
    content: str
    tool_calls: list[ToolCall] | None
    finish: str
    matched: int | str | None


def parse_output(state: SimulatorState, request: ChatCompletionRequest,
                 c: answers.Completion) -> Parsed:
    """Split reasoning and tool calls out of the raw text, as SGLang's parsers do."""
    if state.reasoning_parser and request.separate_reasoning and c.thinking:
        reasoning: str | None = c.reasoning or None
        content = c.content
    else:
        reasoning = None
        content = answers.raw_text(c)
    finish, matched = c.finish_reason, c.matched_stop
    tool_calls = None
    if (state.tool_parser and request.tools and request.tool_choice != "none"
            and c.tool_name is not None and c.tool_arguments is not None):
        cut = content.find("<tool_call>")
        content = content[:cut].strip() if cut != -1 else content
        tool_calls = [ToolCall(id=f"call_{os.urandom(12).hex()}", index=0,
                               function=FunctionResponse(name=c.tool_name,
                                                         arguments=c.tool_arguments))]
        if finish == "stop":
            finish, matched = "tool_calls", None
    return Parsed(reasoning=reasoning, content=content, tool_calls=tool_calls,
                  finish=finish, matched=matched)


class Generated(msgspec.Struct, kw_only=True):
    completion: answers.Completion
    parsed: Parsed
    spec_u: float


# ------------------------------------------------------------------ handlers


async def health(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return web.Response(status=503 if state.warming() else 200)


async def models(request: web.Request) -> web.Response:
    cfg = request.app[STATE].config
    card = ModelCard(id=cfg.model_name, created=int(time.time()), root=cfg.model_path,
                     max_model_len=cfg.context_length)
    return _json(ENCODER.encode(ModelList(data=[card])))


async def model_info(request: web.Request) -> web.Response:
    cfg = request.app[STATE].config
    return _json(ENCODER.encode({
        "model_path": cfg.model_path,
        "tokenizer_path": cfg.model_path,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": cfg.weight_version,
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
    }))


async def server_info(request: web.Request) -> web.Response:
    state = request.app[STATE]
    cfg = state.config
    info: dict[str, Any] = {name: getattr(cfg, name) for name in cfg.__struct_fields__}
    info.update(
        served_model_name=cfg.model_name,
        speculative_algorithm="EAGLE" if cfg.speculative else None,
        version=cfg.version,
        simulator="tokenmill",
        internal_states=[{
            "max_total_num_tokens": cfg.max_total_num_tokens,
            "max_running_requests": cfg.max_running_requests,
            "avg_spec_accept_length": state.stats.last_spec_accept_length,
            "last_gen_throughput": state.scheduler.throughput(time.monotonic()),
        }],
    )
    return _json(ENCODER.encode(info))


async def metrics(request: web.Request) -> web.Response:
    body = request.app[STATE].metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def _generate(state: SimulatorState, request: ChatCompletionRequest, key: bytes,
              thinking: bool, budget: int, abort_at: float | None) -> Generated:
    plan = answers.plan_answer(state.config, state.lengths, state.corpus, key,
                               thinking=thinking, tools=request.tools,
                               tool_choice=request.tool_choice)
    stop = request.stop
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    completion = answers.complete(plan, state.corpus, budget=budget,
                                  eos_token_id=state.config.eos_token_id, stops=stops,
                                  ignore_eos=request.ignore_eos,
                                  no_stop_trim=request.no_stop_trim, abort_at=abort_at)
    completion = answers.clip_text(completion, plan, state.config.text_words_max)
    return Generated(completion=completion, parsed=parse_output(state, request, completion),
                     spec_u=unit(key, 4))


async def chat_completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    cfg = state.config
    if state.warming():
        return _error("The server is warming up; retry later.", "ServiceUnavailableError", 503)
    if state.faults.should_crash():
        state.crash_hook()
        return _error("simulated crash", "InternalServerError", 500)
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        body = await request.read()
        state.log_request(body)
        req = parse_request(body)
        thinking = thinking_enabled(req)
        f = facts(req, cfg.seed, thinking)
        max_new = req.max_completion_tokens or req.max_tokens
        check_lengths(cfg, f.prompt_tokens, max_new)
    except RequestError as exc:
        return _error(exc.message, exc.err_type, exc.code)

    fault, spare = state.faults.draw(f.prompt_key)
    if fault is Transient.ERROR:
        return _error("Internal server error: simulated fault", "InternalServerError",
                      cfg.error_status)
    if fault is Transient.STALL:
        await asyncio.sleep(cfg.stall_seconds)
    abort_at = spare if fault is Transient.ABORT else None

    budget = max_new if max_new is not None else cfg.context_length - f.prompt_tokens
    results = []
    for i in range(req.n):
        key = f.key if i == 0 else f.key[:-1] + bytes([(f.key[-1] + i) % 256])
        results.append(_generate(state, req, key, thinking, budget, abort_at))
    completion_tokens = sum(g.completion.completion_tokens for g in results)
    cached = state.cache.lookup_and_insert(f)

    rid = req.rid[0] if isinstance(req.rid, list) and req.rid else req.rid
    rid = rid if isinstance(rid, str) else os.urandom(16).hex()

    if req.stream:
        return await _stream(request, state, req, rid, f.prompt_tokens, cached, results,
                             completion_tokens, started)

    queue_time = 0.0
    if cfg.zero_delay:
        state.scheduler.count_instant(completion_tokens)
    else:
        times = await state.scheduler.run(f.prompt_tokens, completion_tokens)
        queue_time = times.queue_time
    e2e = loop.time() - started
    return _json(ENCODER.encode(_response(state, req, rid, f.prompt_tokens, cached, results,
                                          completion_tokens, e2e, queue_time)))


def _account(state: SimulatorState, prompt_tokens: int, cached: int, results: list[Generated],
             completion_tokens: int, e2e: float) -> None:
    aborted = any(g.completion.finish_reason == "abort" for g in results)
    state.stats.finished(prompt_tokens, completion_tokens, cached, e2e, aborted)
    if state.config.speculative:
        for g in results:
            meta = spec_meta(state.config, g.completion.completion_tokens, g.spec_u)
            if meta["spec_verify_ct"]:
                state.stats.spec(meta["spec_accept_length"], meta["spec_accept_rate"])


def _usage(state: SimulatorState, prompt_tokens: int, cached: int, results: list[Generated],
           completion_tokens: int) -> UsageInfo:
    details = None
    if state.config.enable_cache_report and cached > 0:
        details = PromptTokensDetails(cached_tokens=cached)
    return UsageInfo(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                     total_tokens=prompt_tokens + completion_tokens,
                     prompt_tokens_details=details,
                     reasoning_tokens=sum(g.completion.reasoning_tokens for g in results))


def _content(state: SimulatorState, text: str) -> str | None:
    if text:
        return text
    return "" if state.config.empty_content == "empty" else None


def _response(state: SimulatorState, req: ChatCompletionRequest, rid: str, prompt_tokens: int,
              cached: int, results: list[Generated], completion_tokens: int, e2e: float,
              queue_time: float) -> ChatCompletionResponse:
    cfg = state.config
    _account(state, prompt_tokens, cached, results, completion_tokens, e2e)
    choices = []
    for index, g in enumerate(results):
        p, c = g.parsed, g.completion
        choice = ChatCompletionChoice(
            index=index,
            message=ChatMessage(content=_content(state, p.content),
                                reasoning_content=p.reasoning, tool_calls=p.tool_calls),
            finish_reason=p.finish,
            matched_stop=p.matched,
        )
        if req.return_meta_info:
            meta: dict[str, Any] = {
                "id": rid,
                "finish_reason": finish_dict(c, p.finish, p.matched),
                "prompt_tokens": prompt_tokens,
                "weight_version": cfg.weight_version,
                "total_retractions": 0,
                "completion_tokens": c.completion_tokens,
                "cached_tokens": cached,
                "reasoning_tokens": c.reasoning_tokens,
                "queue_time": queue_time,
                "e2e_latency": e2e,
            }
            if cfg.speculative:
                meta.update(spec_meta(cfg, c.completion_tokens, g.spec_u))
            choice.meta_info = meta
        choices.append(choice)
    return ChatCompletionResponse(
        id=rid, created=int(time.time()), model=req.model, choices=choices,
        usage=_usage(state, prompt_tokens, cached, results, completion_tokens),
        metadata={"weight_version": cfg.weight_version},
    )


def _pieces(text: str, count: int) -> list[str]:
    """Split `text` into about `count` pieces at spaces (SSE deltas)."""
    if not text:
        return []
    size = max(len(text) // count, 1)
    out, start = [], 0
    while start < len(text):
        end = text.find(" ", start + size)
        end = len(text) if end == -1 else end
        out.append(text[start:end])
        start = end
    return out


async def _stream(request: web.Request, state: SimulatorState, req: ChatCompletionRequest,
                  rid: str, prompt_tokens: int, cached: int, results: list[Generated],
                  completion_tokens: int, started: float) -> web.StreamResponse:
    """SSE in SGLang's chunk shapes; deltas are sent once the answer is decoded."""
    loop = asyncio.get_running_loop()
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
    await response.prepare(request)
    created = int(time.time())

    def chunk(index: int, delta: DeltaMessage, finish: str | None = None,
              matched: int | str | None = None, usage: UsageInfo | None = None,
              empty: bool = False) -> bytes:
        choices = [] if empty else [StreamChoice(index=index, delta=delta,
                                                 finish_reason=finish, matched_stop=matched)]
        body = ChatCompletionStreamResponse(id=rid, created=created, model=req.model,
                                            choices=choices, usage=usage)
        return b"data: " + ENCODER.encode(body) + b"\n\n"

    try:
        first = asyncio.Event()
        job = None
        if state.config.zero_delay:
            state.scheduler.count_instant(completion_tokens)
            first.set()
        else:
            job = asyncio.ensure_future(
                state.scheduler.run(prompt_tokens, completion_tokens, first_token=first))
            await first.wait()
        for i in range(len(results)):
            await response.write(chunk(i, DeltaMessage(role="assistant", content="")))
        if job is not None:
            await job
        for i, g in enumerate(results):
            p = g.parsed
            for piece in _pieces(p.reasoning or "", STREAM_PIECES):
                await response.write(chunk(i, DeltaMessage(reasoning_content=piece)))
            for piece in _pieces(p.content, STREAM_PIECES):
                await response.write(chunk(i, DeltaMessage(content=piece)))
            if p.tool_calls:
                await response.write(chunk(i, DeltaMessage(tool_calls=p.tool_calls)))
            await response.write(chunk(i, DeltaMessage(), finish=p.finish, matched=p.matched))
        e2e = loop.time() - started
        _account(state, prompt_tokens, cached, results, completion_tokens, e2e)
        if req.stream_options is not None and req.stream_options.include_usage:
            usage = _usage(state, prompt_tokens, cached, results, completion_tokens)
            await response.write(chunk(0, DeltaMessage(), usage=usage, empty=True))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
    except (ConnectionResetError, asyncio.CancelledError):
        if job is not None and not job.done():
            job.cancel()
        raise
    return response


# ------------------------------------------------------------------ factory


def create_app(config: SimulatorConfig, *,
               crash_hook: Callable[[], None] | None = None) -> web.Application:
    """An aiohttp app simulating one SGLang server configured by `config`."""
    config.validate()
    app = web.Application(client_max_size=256 * 1024 * 1024)
    app[STATE] = SimulatorState(config, crash_hook or _default_crash)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/health", health)
    app.router.add_get("/health_generate", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/get_model_info", model_info)
    app.router.add_get("/model_info", model_info)
    app.router.add_get("/get_server_info", server_info)
    app.router.add_get("/server_info", server_info)
    app.router.add_get("/metrics", metrics)

    async def on_startup(app: web.Application) -> None:
        state = app[STATE]
        state.started_at = time.monotonic()
        state.collector.now = asyncio.get_running_loop().time
        log.info("sim_sglang_started", model=config.model_name,
                 max_running_requests=config.max_running_requests,
                 time_scale=config.time_scale, zero_delay=config.zero_delay)

    app.on_startup.append(on_startup)
    return app
