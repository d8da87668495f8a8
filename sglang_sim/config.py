"""Every knob of the SGLang simulator in one msgspec Struct.

The CLI (`command.py`) maps one flag to each field, and the subprocess runner
maps each field back to a flag (`to_cli_args`), so a config round-trips
between the in-process and the subprocess simulator without loss.
"""

from __future__ import annotations

import math
from typing import Literal

import msgspec

EmptyContent = Literal["empty", "null"]


class InvalidConfig(ValueError):
    """A setting that cannot work; `field` names it (the CLI maps it to its flag)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


# field -> smallest value that works
_MINIMA: dict[str, float] = {
    "port": 0, "eos_token_id": 0, "decode_rate": 0, "prefill_rate": 0, "max_total_tok_s": 0,
    "max_total_num_tokens": 1, "speculative_num_draft_tokens": 1, "length_sigma": 0,
    "warmup_seconds": 0, "stall_seconds": 0, "crash_after": 1, "text_words_max": 0,
}


class SimulatorConfig(msgspec.Struct, kw_only=True, frozen=True):
    """Settings of one simulated SGLang server (defaults: a Qwen3 8B-ish box)."""

    # --- serving identity -------------------------------------------------
    host: str = "127.0.0.1"
    port: int = 30000
    model_path: str = "Qwen/Qwen3-8B"
    served_model_name: str | None = None  # defaults to model_path, as in SGLang
    context_length: int = 32768
    weight_version: str = "default"
    version: str = "0.5.4"  # reported by /get_server_info
    eos_token_id: int = 151645  # Qwen3 <|im_end|>, reported as matched_stop

    # --- determinism ------------------------------------------------------
    seed: int = 0

    # --- parsers and reporting (SGLang server flags) ----------------------
    reasoning_parser: str | None = "qwen3"
    tool_call_parser: str | None = None
    tool_call_rate: float = 0.5  # share of answers with tools that call one
    # Tool calls gone wrong (shares of the calls; they add up to at most 1):
    # arguments that are not JSON, a function nobody offered, arguments that
    # break the tool's JSON Schema (a required property left out).
    malformed_tool_call_rate: float = 0.0
    unknown_tool_call_rate: float = 0.0
    invalid_tool_arguments_rate: float = 0.0
    enable_cache_report: bool = False
    empty_content: EmptyContent = "empty"  # "" (SGLang >= 0.5.x main) or null (older)

    # --- capacity model -----------------------------------------------------
    max_running_requests: int = 64
    decode_rate: float = 60.0  # target-model tok/s per request, before speculation
    prefill_rate: float = 20000.0  # prompt tok/s per request; 0 = instant prefill
    max_total_tok_s: float = 0.0  # aggregate decode tok/s cap; 0 = no cap
    max_total_num_tokens: int = 400000  # KV pool size, for sglang:token_usage
    speculative_accept_length: float = 1.0  # > 1 turns on speculative decoding
    speculative_num_draft_tokens: int = 4
    time_scale: float = 1.0  # 1000 = simulated time runs 1000x faster than real
    zero_delay: bool = False  # answer at once: throughput benchmarks

    # --- output lengths (lognormal, see lengths.py) ------------------------
    length_median: float = 2228.0
    length_sigma: float = 0.665
    length_min: int = 8
    length_max: int = 32768
    thinking_share_min: float = 0.6
    thinking_share_max: float = 0.9
    # Not an SGLang setting: benchmarks that cannot afford the bytes of full
    # answers (bench/bench_seed_run.py) return at most this many words of
    # reasoning and of content (a tool-call block stays whole); token counts,
    # timing and finish_reason still follow the full answer. 0 = full text.
    text_words_max: int = 0

    # --- faults -------------------------------------------------------------
    warmup_seconds: float = 0.0
    error_rate: float = 0.0
    error_status: int = 500
    stall_rate: float = 0.0
    stall_seconds: float = 30.0  # real seconds, not scaled
    abort_rate: float = 0.0
    crash_after: int | None = None  # os._exit after this many chat requests
    empty_rate: float = 0.0
    trivial_rate: float = 0.0

    # --- observation -----------------------------------------------------------
    request_log: str | None = None  # append {"rid", "messages", "at"} of each chat request (JSONL)

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model_path

    @property
    def speculative(self) -> bool:
        return self.speculative_accept_length > 1.0

    def validate(self) -> SimulatorConfig:
        """Reject settings that cannot work (InvalidConfig naming the field);
        returns self so it chains."""
        self._check_each_field()
        self._check_shares()
        self._check_serving()
        self._check_output_model()
        return self

    def _check_each_field(self) -> None:
        """Every number finite, and at least its field's minimum."""
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if isinstance(value, float) and not math.isfinite(value):
                raise InvalidConfig(name, f"{name} must be a finite number, got {value}")
            if name in _MINIMA and value is not None and value < _MINIMA[name]:
                raise InvalidConfig(name, f"{name} must be >= {_MINIMA[name]:g}, got {value}")

    def _check_shares(self) -> None:
        """Rates are shares of requests (or of tool calls): within [0, 1]."""
        for name in ("error_rate", "stall_rate", "abort_rate", "empty_rate", "trivial_rate",
                     "tool_call_rate", "malformed_tool_call_rate", "unknown_tool_call_rate",
                     "invalid_tool_arguments_rate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise InvalidConfig(name, f"{name} must be within [0, 1], got {value}")
        if (self.malformed_tool_call_rate + self.unknown_tool_call_rate
                + self.invalid_tool_arguments_rate) > 1.0:
            raise InvalidConfig("malformed_tool_call_rate", "the bad tool call rates add up to "
                                "more than 1")

    def _check_serving(self) -> None:
        if self.port > 65535:
            raise InvalidConfig("port", f"port must be within 0-65535, got {self.port}")
        if not 400 <= self.error_status <= 599:
            raise InvalidConfig("error_status", "error_status must be an HTTP error status "
                                f"(400-599), got {self.error_status}")
        if self.max_running_requests < 1:
            raise InvalidConfig("max_running_requests", "max_running_requests must be >= 1")
        if self.time_scale <= 0:
            raise InvalidConfig("time_scale", "time_scale must be > 0")
        if self.context_length < 16:
            raise InvalidConfig("context_length", "context_length must be >= 16")

    def _check_output_model(self) -> None:
        """Lengths, speculative decoding and thinking shares that can be drawn."""
        if not 1 <= self.length_min <= self.length_max:
            raise InvalidConfig("length_min", "need 1 <= length_min <= length_max")
        if self.length_median <= 0:
            raise InvalidConfig("length_median", "length_median must be > 0")
        if self.speculative_accept_length < 1.0:
            raise InvalidConfig("speculative_accept_length",
                                "speculative_accept_length must be >= 1")
        if self.speculative and self.speculative_accept_length > self.speculative_num_draft_tokens:
            raise InvalidConfig("speculative_accept_length", "speculative_accept_length cannot "
                                "exceed speculative_num_draft_tokens")
        if not 0.0 <= self.thinking_share_min <= self.thinking_share_max <= 1.0:
            raise InvalidConfig("thinking_share_min",
                                "need 0 <= thinking_share_min <= thinking_share_max <= 1")


def to_cli_args(config: SimulatorConfig) -> list[str]:
    """Flags for `tokenmill sim-sglang` that reproduce `config` (non-defaults only)."""
    default = SimulatorConfig()
    args: list[str] = []
    for field in config.__struct_fields__:
        value = getattr(config, field)
        if value == getattr(default, field):
            continue
        flag = "--" + field.replace("_", "-")
        if isinstance(value, bool):
            args.append(flag if value else "--no-" + field.replace("_", "-"))
        elif value is None:
            args += [flag, "none"]
        else:
            args += [flag, str(value)]
    return args
