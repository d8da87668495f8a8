"""What the simulated model says: a token plan from the prompt hash, then a cut.

An answer is planned as the token sequence a Qwen3-style thinking model
emits, counted with the simulator's token rule (one corpus word = one token,
a tool-call block = ceil(chars / 4) tokens, each special token = 1)::

    <think>  R reasoning words  </think>  content (words | preface + <tool_call>)  <eos>

(no ``<think>`` part when thinking is off). The natural length comes from the
length model; the plan is then cut at the token budget (``max_tokens``) or at
an abort point. ``reasoning_tokens`` counts ``<think>`` through ``</think>``;
``completion_tokens`` counts every emitted token, the eos included, so a
length cut gives exactly ``completion_tokens == max_tokens``.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from sglang_sim.config import SimulatorConfig
from sglang_sim.faults import ContentFault, content_fault, unit
from sglang_sim.lengths import LengthModel
from sglang_sim.protocol import Tool
from sglang_sim.textgen import Corpus, object_arguments, tool_call_text
from sglang_sim.tokens import text_tokens

TRIVIAL_TEXT = "OK."
TRIVIAL_TOKENS = 2  # "OK" "."


class Plan(msgspec.Struct, kw_only=True):
    """The natural (un-cut) answer, as segment sizes and corpus offsets."""

    thinking: bool
    reasoning_words: int
    reasoning_offset: int
    content_words: int  # plain words, or the preface before a tool call
    content_offset: int
    fixed_text: str | None = None  # trivial answers
    fixed_tokens: int = 0
    tool_name: str | None = None
    tool_arguments: str | None = None  # JSON
    tool_block: str | None = None
    tool_tokens: int = 0
    eos: bool = True

    @property
    def think_tokens(self) -> int:
        return self.reasoning_words + 2 if self.thinking else 0

    @property
    def content_tokens(self) -> int:
        return self.content_words + self.fixed_tokens + self.tool_tokens

    @property
    def total_tokens(self) -> int:
        return self.think_tokens + self.content_tokens + (1 if self.eos else 0)


class Completion(msgspec.Struct, kw_only=True):
    """One choice, ready to serialize: texts, finish and token counts."""

    reasoning: str  # raw reasoning text ("" when none)
    content: str  # text after </think>, tool-call block included
    thinking: bool  # whether a <think> block was opened
    think_closed: bool
    tool_name: str | None
    tool_arguments: str | None
    finish_reason: str  # stop | length | abort
    matched_stop: int | str | None
    completion_tokens: int
    reasoning_tokens: int


def pick_tool(tools: list[Tool], tool_choice: Any, r: int) -> Tool | None:
    """The tool to call: the named one, else one chosen by `r`."""
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name")
        for tool in tools:
            if tool.function.name == name:
                return tool
        return None
    return tools[r % len(tools)] if tools else None


def wants_tool_call(config: SimulatorConfig, tool_choice: Any, u: float) -> bool:
    """Whether this answer calls a tool (given tools are present)."""
    if tool_choice == "none":
        return False
    if tool_choice == "required" or isinstance(tool_choice, dict):
        return True
    return u < config.tool_call_rate


def bad_tool_call(config: SimulatorConfig, u: float, name: str, args: dict[str, Any],
                  params: dict[str, Any]) -> tuple[str, dict[str, Any], bool]:
    """(function name, arguments, arguments text cut short?) after the bad
    tool call faults: a malformed call, an unknown function, or a required
    argument left out."""
    malformed = config.malformed_tool_call_rate
    unknown = malformed + config.unknown_tool_call_rate
    if u < malformed:
        return name, args, True
    if u < unknown:
        return f"{name}_unknown", args, False
    if u < unknown + config.invalid_tool_arguments_rate:
        required = [k for k in params.get("required") or [] if k in args]
        return name, {k: v for k, v in args.items() if k != (required[:1] or [None])[0]}, False
    return name, args, False


def plan_answer(
    config: SimulatorConfig,
    lengths: LengthModel,
    corpus: Corpus,
    digest: bytes,
    *,
    thinking: bool,
    tools: list[Tool] | None,
    tool_choice: Any,
) -> Plan:
    """The natural answer for a prompt hash; pure, so reruns give the same text."""
    r_offsets = int.from_bytes(digest[16:24], "big")
    fault = content_fault(config, unit(digest, 2))
    if fault is ContentFault.EMPTY:
        return Plan(thinking=thinking, reasoning_words=0, reasoning_offset=0,
                    content_words=0, content_offset=0)
    if fault is ContentFault.TRIVIAL:
        return Plan(thinking=thinking, reasoning_words=0, reasoning_offset=0, content_words=0,
                    content_offset=0, fixed_text=TRIVIAL_TEXT, fixed_tokens=TRIVIAL_TOKENS)

    natural = lengths.length(unit(digest, 0))
    overhead = 3 if thinking else 1
    body = max(natural - overhead, 1)
    if thinking:
        lo, hi = config.thinking_share_min, config.thinking_share_max
        share = lo + (hi - lo) * unit(digest, 1)
        reasoning = min(int(body * share), body - 1) if body > 1 else 0
    else:
        reasoning = 0
    content = body - reasoning
    plan = Plan(
        thinking=thinking,
        reasoning_words=reasoning,
        reasoning_offset=r_offsets & 0xFFFFFFFF,
        content_words=content,
        content_offset=r_offsets >> 32,
    )
    if tools and wants_tool_call(config, tool_choice, unit(digest, 3)):
        seed = int.from_bytes(digest[24:32], "big")
        tool = pick_tool(tools, tool_choice, seed)
        if tool is not None:
            params = tool.function.parameters or {}
            args = object_arguments(params, seed >> 8, corpus)
            name, args, broken = bad_tool_call(config, unit(digest, 6), tool.function.name,
                                               args, params)
            block = tool_call_text(name, args)
            plan.tool_name = name
            plan.tool_arguments = json.dumps(args, ensure_ascii=False)[:-1] if broken else \
                json.dumps(args, ensure_ascii=False)
            plan.tool_block = block
            plan.tool_tokens = text_tokens(len(block))
            plan.content_words = min(content, int(unit(digest, 7) * 24))  # short preface
    return plan


def _content_text(plan: Plan, corpus: Corpus, tokens: int) -> tuple[str, bool]:
    """First `tokens` content tokens as text, and whether the content is whole."""
    if tokens >= plan.content_tokens:
        tokens = plan.content_tokens
        whole = True
    else:
        whole = False
    if plan.fixed_text is not None:
        return (plan.fixed_text if whole else plan.fixed_text[: max(tokens, 0)]), whole
    words = min(tokens, plan.content_words)
    text = corpus.words(plan.content_offset, words)
    if plan.tool_block is not None and tokens > plan.content_words:
        block_tokens = tokens - plan.content_words
        if block_tokens >= plan.tool_tokens:
            block = plan.tool_block
        else:
            block = plan.tool_block[: len(plan.tool_block) * block_tokens // plan.tool_tokens]
        text = f"{text}\n\n{block}" if text else block
    return text, whole


def emit(plan: Plan, corpus: Corpus, tokens: int) -> tuple[str, str, bool, int]:
    """Cut the plan after `tokens` tokens: (reasoning, content, think_closed, reasoning_tokens)."""
    if not plan.thinking:
        content, _ = _content_text(plan, corpus, tokens)
        return "", content, False, 0
    if tokens <= 0:
        return "", "", False, 0
    if tokens < plan.think_tokens:  # cut inside the thinking
        reasoning = corpus.words(plan.reasoning_offset, tokens - 1)
        return reasoning, "", False, tokens
    reasoning = corpus.words(plan.reasoning_offset, plan.reasoning_words)
    content, _ = _content_text(plan, corpus, tokens - plan.think_tokens)
    return reasoning, content, True, plan.think_tokens


def _apply_stop(content: str, stops: list[str], no_stop_trim: bool) -> tuple[str, str] | None:
    """Earliest stop string in the content: (trimmed content, matched) or None."""
    best: tuple[int, str] | None = None
    for stop in stops:
        if not stop:
            continue
        pos = content.find(stop)
        if pos != -1 and (best is None or pos < best[0]):
            best = (pos, stop)
    if best is None:
        return None
    pos, stop = best
    end = pos + len(stop) if no_stop_trim else pos
    return content[:end], stop


def complete(
    plan: Plan,
    corpus: Corpus,
    *,
    budget: int,
    eos_token_id: int,
    stops: list[str],
    ignore_eos: bool = False,
    no_stop_trim: bool = False,
    abort_at: float | None = None,
) -> Completion:
    """Cut the plan at the token budget (length), a stop string, or an abort point."""
    if ignore_eos:
        plan = msgspec.structs.replace(plan, eos=False)
        if plan.tool_block is None and plan.fixed_text is None:
            extra = max(budget - plan.total_tokens + 1, 0)
            plan = msgspec.structs.replace(plan, content_words=plan.content_words + extra)
    total = plan.total_tokens
    if abort_at is not None:
        emitted = int(min(total, budget) * abort_at)
        reasoning, content, closed, rtoks = emit(plan, corpus, emitted)
        return Completion(reasoning=reasoning, content=content, thinking=plan.thinking,
                          think_closed=closed, tool_name=None, tool_arguments=None,
                          finish_reason="abort", matched_stop=None,
                          completion_tokens=emitted, reasoning_tokens=rtoks)
    matched: int | str | None
    if total > budget:
        emitted = budget
        finish, matched = "length", None
    else:
        emitted = total
        finish, matched = "stop", (eos_token_id if plan.eos else None)
    reasoning, content, closed, rtoks = emit(plan, corpus, emitted)
    tool_name = tool_arguments = None
    if finish == "stop" and plan.tool_block is not None:
        tool_name, tool_arguments = plan.tool_name, plan.tool_arguments
    if stops and content and plan.tool_block is None:
        hit = _apply_stop(content, stops, no_stop_trim)
        if hit is not None:
            content, matched = hit
            finish = "stop"
            emitted = rtoks + corpus.word_count(content) + 1
    return Completion(reasoning=reasoning, content=content, thinking=plan.thinking,
                      think_closed=closed, tool_name=tool_name, tool_arguments=tool_arguments,
                      finish_reason=finish, matched_stop=matched,
                      completion_tokens=emitted, reasoning_tokens=rtoks)


def raw_text(c: Completion) -> str:
    """The decoded output as SGLang sees it before any parser runs."""
    if not c.thinking:
        return c.content
    if not c.think_closed:
        return f"<think>\n{c.reasoning}" if c.reasoning else "<think>\n"
    return f"<think>\n{c.reasoning}\n</think>\n\n{c.content}"


def first_words(text: str, words: int) -> str:
    """The first `words` space-separated words of `text` (all of it when shorter)."""
    parts = text.split(" ", words)
    return text if len(parts) <= words else " ".join(parts[:words])


def clip_text(c: Completion, plan: Plan, words: int) -> Completion:
    """`c` with at most `words` words of reasoning and of content (0: as is).
    A whole tool-call block stays whole after the clipped preface, so the
    parser still finds the call; token counts and finish_reason are kept:
    they describe the answer the model produced, of which only the text is
    shortened (the simulator's `text_words_max`, for benchmarks)."""
    if words <= 0:
        return c
    content = c.content
    block = plan.tool_block
    if block is not None and content.endswith(block):
        preface = first_words(content[: -len(block)].rstrip("\n"), words)
        content = f"{preface}\n\n{block}" if preface else block
    else:
        content = first_words(content, words)
    return msgspec.structs.replace(c, reasoning=first_words(c.reasoning, words), content=content)
