"""The HTTP side: one chat request per prompt to an OpenAI-compatible server
(SGLang first; vLLM and others work where SGLang's extras are absent), and
the failure taxonomy that decides what happens next.

`Outcome` classes say whose fault a failure is:
- `PromptRejected`: the prompt itself (400 too long, bad request) - record a
  failure at once;
- `Retryable`: transient (5xx, timeout, abort) - retry with backoff;
- `ServerUnavailable`: the server is down or loading - pause, never the
  prompt's fault;
- `ServerRefused`: 404/405/501 - the server does not serve this API; the
  worker's circuit breaker holds the prompts after a few;
- `ServerMisconfigured`: 401/403 - every prompt would fail; stop.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import msgspec

from schemas import GenerationSettings, PromptRecord, SpecStats, ToolCall, Usage
from schemas.messages import FunctionCall
from tokenmill.settings import Secret


class GenerationError(Exception):
    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class PromptRejected(GenerationError):
    def __init__(self, message: str, status: int | None, kind: str) -> None:
        super().__init__(message, status)
        self.kind = kind  # prompt_too_long | bad_request


class Retryable(GenerationError):
    def __init__(self, message: str, status: int | None, kind: str) -> None:
        super().__init__(message, status)
        self.kind = kind  # server_error | timeout | abort | invalid_response


class ServerUnavailable(GenerationError):
    """Connection refused, reset, or 503: wait for the server, do not fail prompts."""


class ServerMisconfigured(GenerationError):
    """The server refuses our credentials (401/403): every prompt would fail."""


class ServerRefused(GenerationError):
    """The server cannot serve this API (404/405/501: not SGLang, wrong path):
    not the prompt's fault, not transient; the circuit breaker decides."""

    kind = "server_error"


# --- response shapes (lenient: every field optional) ------------------------


class _Function(msgspec.Struct, frozen=True):
    name: str = ""
    arguments: str | dict[str, Any] | None = None


class _ToolCall(msgspec.Struct, frozen=True):
    function: _Function = _Function()
    id: str | None = None
    type: str = "function"


class _Message(msgspec.Struct, frozen=True):
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[_ToolCall] | None = None


class _Choice(msgspec.Struct, frozen=True):
    message: _Message = _Message()
    finish_reason: str | None = None
    matched_stop: int | str | None = None
    meta_info: dict[str, Any] | None = None


class _TokenDetails(msgspec.Struct, frozen=True):
    cached_tokens: int | None = 0
    reasoning_tokens: int | None = 0


class _Usage(msgspec.Struct, frozen=True):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int | None = None
    prompt_tokens_details: _TokenDetails | None = None
    completion_tokens_details: _TokenDetails | None = None


class _Response(msgspec.Struct, frozen=True):
    choices: list[_Choice] = []
    usage: _Usage | None = None
    model: str = ""


class _ErrorBody(msgspec.Struct, frozen=True):
    message: str = ""
    error: dict[str, Any] | str | None = None


_response_decoder = msgspec.json.Decoder(_Response)
_error_decoder = msgspec.json.Decoder(_ErrorBody)
_encoder = msgspec.json.Encoder()


class Generated(msgspec.Struct, frozen=True):
    """What one successful request produced."""

    finish_reason: str
    content: str | None
    reasoning_content: str | None
    tool_calls: tuple[ToolCall, ...] | None
    matched_stop: int | str | None
    usage: Usage
    spec: SpecStats
    model: str
    latency_s: float


# --- pure pieces -------------------------------------------------------------


def request_body(prompt: PromptRecord, settings: GenerationSettings,
                 attempt: int = 1) -> dict[str, Any]:
    """The chat request for a prompt. `rid` is the prompt id (suffixed on
    retries, because SGLang refuses a rid that is still running)."""
    body: dict[str, Any] = {
        "model": settings.model,
        "messages": [msgspec.to_builtins(m) for m in prompt.messages],
        "max_tokens": settings.max_tokens,
        "temperature": settings.temperature,
        "top_p": settings.top_p,
        "top_k": settings.top_k,
        "stream": False,
        "chat_template_kwargs": {"enable_thinking": settings.enable_thinking},
        "separate_reasoning": True,
        "return_meta_info": True,
        "rid": prompt.id if attempt == 1 else f"{prompt.id}.{attempt}",
    }
    if settings.seed is not None:
        body["seed"] = settings.seed
    if prompt.tools:
        body["tools"] = list(prompt.tools)
    return body


_TOO_LONG_MARKERS = ("context length", "maximum context", "too long", "exceeds the max",
                     "max_model_len", "is longer than", "exceed")


def classify_status(status: int, message: str) -> GenerationError:
    """An HTTP error status (with the server's message) -> what to do."""
    lowered = message.lower()
    if status == 400:
        kind = "prompt_too_long" if any(m in lowered for m in _TOO_LONG_MARKERS) else "bad_request"
        return PromptRejected(message, status, kind)
    if status == 413:
        return PromptRejected(message, status, "prompt_too_long")
    if status in (401, 403):
        return ServerMisconfigured(f"HTTP {status}: {message}", status)
    if status in (404, 405, 501):
        return ServerRefused(f"HTTP {status}: {message}", status)
    if status == 503:
        return ServerUnavailable(f"HTTP 503: {message}", status)
    if status == 422:
        return PromptRejected(message, status, "bad_request")
    return Retryable(f"HTTP {status}: {message}", status, "server_error")


def error_message(payload: bytes) -> str:
    try:
        body = _error_decoder.decode(payload)
    except msgspec.DecodeError:
        return payload[:500].decode(errors="replace")
    if isinstance(body.error, dict):
        return str(body.error.get("message", body.error))
    return body.message or (str(body.error) if body.error
                            else payload[:500].decode(errors="replace"))


def _arguments(raw: str | dict[str, Any] | None) -> str:
    if raw is None:
        return "{}"
    return raw if isinstance(raw, str) else _encoder.encode(raw).decode()


def parse_response(payload: bytes, latency_s: float) -> Generated:
    try:
        response = _response_decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise Retryable(f"invalid response: {exc}", 200, "invalid_response") from None
    if not response.choices:
        raise Retryable("invalid response: no choices", 200, "invalid_response")
    choice = response.choices[0]
    finish = choice.finish_reason or "unknown"
    if finish == "abort":
        raise Retryable("the server aborted the request (finish_reason abort)", 200, "abort")
    usage = response.usage or _Usage()
    meta = choice.meta_info or {}
    reasoning_tokens = usage.reasoning_tokens
    if reasoning_tokens is None and usage.completion_tokens_details is not None:
        reasoning_tokens = usage.completion_tokens_details.reasoning_tokens
    if reasoning_tokens is None:
        reasoning_tokens = meta.get("reasoning_tokens")
    cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else None
    if cached is None:
        cached = meta.get("cached_tokens")
    tool_calls = None
    if choice.message.tool_calls:
        tool_calls = tuple(
            ToolCall(id=call.id or "", type=call.type or "function",
                     function=FunctionCall(name=call.function.name,
                                           arguments=_arguments(call.function.arguments)))
            for call in choice.message.tool_calls
        )
    return Generated(
        finish_reason=finish,
        content=choice.message.content,
        reasoning_content=choice.message.reasoning_content,
        tool_calls=tool_calls,
        matched_stop=choice.matched_stop,
        usage=Usage(prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
                    reasoning_tokens=int(reasoning_tokens or 0), cached_tokens=int(cached or 0)),
        spec=spec_stats(meta),
        model=response.model,
        latency_s=latency_s,
    )


def spec_stats(meta: dict[str, Any]) -> SpecStats:
    """SGLang's per-request speculative stats; empty when absent (vLLM)."""
    accept = meta.get("spec_accept_length")
    verify = meta.get("spec_verify_ct")
    if not verify:
        return SpecStats()
    return SpecStats(
        accept_length=float(accept) if accept is not None else None,
        verify_ct=int(verify),
        draft_tokens=meta.get("spec_draft_token_num"),
        accepted_tokens=meta.get("spec_accept_token_num"),
    )


# --- I/O ---------------------------------------------------------------------


class SGLangClient:
    """One aiohttp session to one server; connection pool sized by the caller."""

    def __init__(self, base_url: str, *, request_timeout_s: float = 1800.0,
                 max_connections: int = 1024, api_key: Secret | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=request_timeout_s, sock_connect=10)
        self._max_connections = max_connections
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key.reveal()}"
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> SGLangClient:
        connector = aiohttp.TCPConnector(limit=self._max_connections, force_close=False)
        self._session = aiohttp.ClientSession(connector=connector, headers=self._headers)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "use SGLangClient as an async context manager"
        return self._session

    async def chat(self, body: dict[str, Any]) -> Generated:
        started = time.monotonic()
        try:
            async with self.session.post(f"{self.base_url}/v1/chat/completions",
                                         data=_encoder.encode(body),
                                         timeout=self._timeout) as response:
                payload = await response.read()
                status = response.status
        except asyncio.TimeoutError:
            raise Retryable(f"timed out after {self._timeout.total:.0f}s", None,
                            "timeout") from None
        except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError,
                aiohttp.ClientOSError) as exc:
            raise ServerUnavailable(f"{type(exc).__name__}: {exc}") from None
        except aiohttp.ClientPayloadError as exc:
            raise Retryable(f"broken response: {exc}", None, "invalid_response") from None
        if status != 200:
            raise classify_status(status, error_message(payload))
        return parse_response(payload, time.monotonic() - started)

    async def _get(self, path: str) -> tuple[int, bytes] | None:
        """A short GET for the server's side endpoints; None when unreachable."""
        try:
            async with self.session.get(f"{self.base_url}{path}",
                                        timeout=aiohttp.ClientTimeout(total=5)) as response:
                return response.status, await response.read()
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return None

    async def check_up(self) -> None:
        """Raise ServerUnavailable while the server does not answer, or answers
        /health with a 5xx (SGLang: 503 while loading the model). A server
        without /health (404) counts as up: the circuit breaker judges it."""
        answer = await self._get("/health")
        if answer is None:
            raise ServerUnavailable("no answer to GET /health (connection refused or timed out)")
        if answer[0] >= 500:
            raise ServerUnavailable(f"GET /health answered {answer[0]} (still loading?)")

    async def healthy(self) -> bool:
        """SGLang answers /health with 200 once the model is loaded (503 before)."""
        answer = await self._get("/health")
        return answer is not None and answer[0] == 200

    async def metrics_text(self) -> str | None:
        answer = await self._get("/metrics")
        if answer is None or answer[0] != 200:
            return None
        return answer[1].decode(errors="replace")

    async def context_length(self) -> int | None:
        """The served model's context length (`max_model_len` of /v1/models, as
        SGLang and vLLM report it); None when the server does not say."""
        answer = await self._get("/v1/models")
        if answer is None or answer[0] != 200:
            return None
        try:
            models = msgspec.json.decode(answer[1])
        except msgspec.DecodeError:
            return None
        data = models.get("data") if isinstance(models, dict) else None
        if not isinstance(data, list) or not data or not isinstance(data[0], dict):
            return None
        value = data[0].get("max_model_len")
        return value if isinstance(value, int) and value > 0 else None

    async def max_running_requests(self) -> int | None:
        """The server's own limit from SGLang's /get_server_info; None elsewhere."""
        answer = await self._get("/get_server_info")
        if answer is None or answer[0] != 200:
            return None
        try:
            info = msgspec.json.decode(answer[1])
        except msgspec.DecodeError:
            return None
        if not isinstance(info, dict):
            return None
        states = info.get("internal_states") or [{}]
        value = states[0].get("max_running_requests") if isinstance(states[0], dict) else None
        value = value or info.get("max_running_requests")
        return value if isinstance(value, int) and value > 0 else None
