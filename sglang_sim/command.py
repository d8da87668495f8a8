"""`tokenmill sim-sglang`: run the SGLang simulator as a server.

One flag per `SimulatorConfig` field (``--max-running-requests`` for
``max_running_requests``, ``--zero-delay/--no-zero-delay`` for booleans,
``none`` for an unset optional). When listening it prints one line to stdout,
``tokenmill sim-sglang listening on http://HOST:PORT``, which is how
subprocess runners learn the port when ``--port 0`` is used.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import types
import typing
from typing import Any

import click
from aiohttp import web

from sglang_sim.config import InvalidConfig, SimulatorConfig
from sglang_sim.server import create_app
from tokenmill.flag_types import FiniteFloat
from tokenmill.log import LogFormat, configure, get_logger

READY_PREFIX = "tokenmill sim-sglang listening on "

HELP: dict[str, str] = {
    "host": "Interface to bind.",
    "port": "Port to bind (0 = any free port; the chosen one is printed).",
    "model_path": "Model path reported by /v1/models and /get_model_info.",
    "served_model_name": "Name in /v1/models and metric labels (default: model path).",
    "context_length": "Context length for SGLang's 400 context-length errors.",
    "weight_version": "weight_version reported in responses and meta_info.",
    "version": "SGLang version reported by /get_server_info.",
    "eos_token_id": "Token id reported as matched_stop on a natural stop.",
    "seed": "Seed of answers and faults; same seed + prompt = same answer.",
    "reasoning_parser": "SGLang --reasoning-parser (qwen3 splits reasoning_content; none = raw).",
    "tool_call_parser": "SGLang --tool-call-parser (e.g. qwen25); none keeps <tool_call> text.",
    "tool_call_rate": "Share of answers to requests with tools that call a tool.",
    "malformed_tool_call_rate": "Share of tool calls whose arguments are not JSON.",
    "unknown_tool_call_rate": "Share of tool calls naming a function nobody offered.",
    "invalid_tool_arguments_rate": "Share of tool calls leaving out a required argument.",
    "request_log": "Append each chat request's rid, messages and arrival time to this JSONL file.",
    "enable_cache_report": "Report usage.prompt_tokens_details.cached_tokens.",
    "empty_content": "Empty content as '' (empty) or null (null).",
    "max_running_requests": "Requests decoded at once; more wait in a FIFO queue.",
    "decode_rate": "Decode tok/s of one request before speculation (0 = instant).",
    "prefill_rate": "Prefill tok/s of one request (0 = instant).",
    "max_total_tok_s": "Aggregate decode tok/s cap across running requests (0 = none).",
    "max_total_num_tokens": "KV pool size in tokens, for sglang:token_usage.",
    "speculative_accept_length": "Mean speculative accept length (>1 turns speculation on).",
    "speculative_num_draft_tokens": "Draft tokens per speculative step.",
    "time_scale": "Simulated seconds per real second (1000 = 1000x faster).",
    "zero_delay": "Answer at once (throughput benchmarks).",
    "length_median": "Median natural answer length in tokens (lognormal).",
    "length_sigma": "Lognormal sigma of answer lengths.",
    "length_min": "Shortest natural answer in tokens.",
    "length_max": "Longest natural answer in tokens.",
    "thinking_share_min": "Smallest share of an answer spent thinking.",
    "thinking_share_max": "Largest share of an answer spent thinking.",
    "text_words_max": ("Return at most this many words of reasoning and of content; usage, "
                       "timing and finish_reason follow the full answer (0 = full text; "
                       "benchmarks only)."),
    "warmup_seconds": "Seconds after start with /health 503 and chat 503.",
    "error_rate": "Share of chat requests answered with a 5xx error.",
    "error_status": "HTTP status of injected errors.",
    "stall_rate": "Share of chat requests that stall before being served.",
    "stall_seconds": "Length of a stall in real seconds.",
    "abort_rate": "Share of chat requests finishing with finish_reason abort.",
    "crash_after": "Exit hard (os._exit) on the chat request after this many (none = never).",
    "empty_rate": "Share of prompts answered with no reasoning and no content.",
    "trivial_rate": "Share of prompts answered with just 'OK.'.",
}


def _base_type(annotation: Any) -> tuple[type, bool]:
    """(scalar type, optional?) of a config field annotation."""
    args = typing.get_args(annotation)
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        inner = [a for a in args if a is not type(None)]
        return inner[0], True
    if typing.get_origin(annotation) is typing.Literal:
        return str, False
    return annotation, False


class _Optional(click.ParamType):  # type: ignore[type-arg,unused-ignore]
    """A scalar that may also be 'none'."""

    def __init__(self, inner: type) -> None:
        self.inner = inner
        self.name = f"{inner.__name__}|none"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value is None or (isinstance(value, str) and value.lower() in ("none", "")):
            return None
        try:
            if self.inner is float:
                return FiniteFloat().convert(value, param, ctx)
            return self.inner(value)
        except (ValueError, click.BadParameter):
            self.fail(f"{value!r} is not a valid {self.inner.__name__} or 'none'", param, ctx)


def _options(command: Any) -> Any:
    default = SimulatorConfig()
    hints = typing.get_type_hints(SimulatorConfig)
    for field in reversed(SimulatorConfig.__struct_fields__):
        kind, optional = _base_type(hints[field])
        flag = "--" + field.replace("_", "-")
        value = getattr(default, field)
        help_text = HELP.get(field, "")
        if kind is bool:
            command = click.option(f"{flag}/--no-{flag[2:]}", field, default=value,
                                   show_default=True, help=help_text)(command)
        elif field == "empty_content":
            command = click.option(flag, field, type=click.Choice(["empty", "null"]),
                                   default=value, show_default=True, help=help_text)(command)
        else:
            ptype: Any = (_Optional(kind) if optional else FiniteFloat() if kind is float
                          else kind)
            command = click.option(flag, field, type=ptype, default=value,
                                   show_default=True, help=help_text)(command)
    return command


def bound_port(site: web.TCPSite) -> int:
    """The port a started site listens on (the real one when asked for port 0)."""
    server = site._server
    sockets = getattr(server, "sockets", None) or []
    if not sockets:
        raise RuntimeError("site is not listening")
    port: int = sockets[0].getsockname()[1]
    return port


async def _serve(config: SimulatorConfig) -> None:
    log = get_logger("sglang_sim")
    app = create_app(config)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port, backlog=4096)
    await site.start()
    port = bound_port(site)
    url = f"http://{config.host}:{port}"
    print(READY_PREFIX + url, flush=True)
    log.info("sim_sglang_listening", url=url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("sim_sglang_stopping")
    await runner.cleanup()


@click.command("sim-sglang", context_settings={"help_option_names": ["-h", "--help"],
                                               "max_content_width": 100})
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
              help="Log level.")
@click.option("--log-format", type=click.Choice(["auto", "json", "console"]), default="auto",
              show_default=True, help="Log rendering.")
@_options
def sim_sglang(log_level: str, log_format: LogFormat, **fields: Any) -> None:
    """An SGLang-compatible test server: OpenAI chat API, faults, capacity model."""
    configure(log_level.lower(), log_format)
    try:
        config = SimulatorConfig(**fields).validate()
    except InvalidConfig as exc:
        raise click.BadParameter(str(exc), param_hint="--" + exc.field.replace("_", "-")) from None
    try:
        asyncio.run(_serve(config))
    except OSError as exc:
        click.echo(f"sim-sglang: cannot listen: {exc}", err=True)
        sys.exit(1)
