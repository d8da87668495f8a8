"""Pure pieces of the simulator: token estimate, lengths, text, cuts, faults, config."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_sim import answers, tokens
from sglang_sim.capacity import decode_rate_each, prefill_seconds
from sglang_sim.command import sim_sglang
from sglang_sim.config import SimulatorConfig, to_cli_args
from sglang_sim.faults import (
    ContentFault,
    FaultInjector,
    Transient,
    content_fault,
    transient_fault,
)
from sglang_sim.lengths import LengthModel
from sglang_sim.prompts import facts
from sglang_sim.protocol import REQUEST_DECODER
from sglang_sim.textgen import Corpus, corpus_for

CORPUS = corpus_for(32768)
CFG = SimulatorConfig()
LENGTHS = LengthModel(CFG.length_median, CFG.length_sigma, CFG.length_min, CFG.length_max)

# ------------------------------------------------------------- token estimate


@given(st.lists(st.integers(0, 100_000), max_size=20), st.integers(0, 50_000),
       st.integers(0, 20), st.integers(1, 5000))
def test_prompt_estimate_grows_with_text(chars: list[int], tools: int, which: int,
                                         extra: int) -> None:
    before = tokens.prompt_tokens(chars, tools)
    if chars:
        more = list(chars)
        more[which % len(chars)] += extra
        assert tokens.prompt_tokens(more, tools) >= before
    assert tokens.prompt_tokens([*chars, 0], tools) > before  # a message costs overhead
    assert tokens.prompt_tokens(chars, tools + extra) >= before


def test_prompt_estimate_rule() -> None:
    # ceil(5/4) + 4 per message, + 3 generation prompt
    assert tokens.prompt_tokens([5]) == 2 + 4 + 3
    assert tokens.prompt_tokens([0, 8]) == 4 + (2 + 4) + 3
    assert tokens.tools_tokens(0) == 0
    assert tokens.tools_tokens(400) == 100 + tokens.TOOLS_OVERHEAD


# ------------------------------------------------------------- lengths


@given(st.floats(0, 1), st.floats(0, 1))
def test_lengths_within_bounds_and_monotonic(u: float, v: float) -> None:
    a, b = LENGTHS.length(u), LENGTHS.length(v)
    assert CFG.length_min <= a <= CFG.length_max
    if u <= v:
        assert a <= b


def test_default_lengths_match_the_seed_run() -> None:
    # a fine grid of quantiles = the distribution
    n = 20000
    lengths = [LENGTHS.length((i + 0.5) / n) for i in range(n)]
    clipped = [min(x, 4096) for x in lengths]
    share_cut = sum(1 for x in lengths if x > 4096) / n
    assert 0.16 < share_cut < 0.20
    assert 2250 < sum(clipped) / n < 2550
    assert abs(LENGTHS.share_above(4096) - share_cut) < 0.01


# ------------------------------------------------------------- text


@given(st.integers(0, 10**9), st.integers(0, 5000))
@settings(max_examples=50)
def test_corpus_slices_have_the_asked_word_count(offset: int, count: int) -> None:
    text = CORPUS.words(offset, count)
    assert CORPUS.word_count(text) == count
    assert text == CORPUS.words(offset, count)


def test_corpus_is_the_same_in_every_instance() -> None:
    a, b = Corpus(5000), Corpus(5000)
    assert a.text == b.text
    assert a.words(123, 40) == b.words(123, 40)
    # pinned: a change here changes every simulated answer (and breaks cross-version reruns)
    assert Corpus(20).text.split()[:3] == CORPUS.text.split()[:3]


@given(st.text(max_size=200), st.integers(-5, 5), st.booleans())
@settings(max_examples=50)
def test_answer_key_is_deterministic(text: str, seed: int, thinking: bool) -> None:
    body = ('{"messages":[{"role":"user","content":' + _json(text) + "}]}").encode()
    a = facts(REQUEST_DECODER.decode(body), seed, thinking)
    b = facts(REQUEST_DECODER.decode(body), seed, thinking)
    assert a.key == b.key
    assert facts(REQUEST_DECODER.decode(body), seed + 1, thinking).key != a.key


def _json(text: str) -> str:
    import json

    return json.dumps(text)


# ------------------------------------------------------------- cuts


def _plan(u_bytes: bytes, thinking: bool = True) -> answers.Plan:
    return answers.plan_answer(CFG, LENGTHS, CORPUS, u_bytes, thinking=thinking, tools=None,
                               tool_choice=None)


@given(st.binary(min_size=32, max_size=32), st.integers(0, 40000), st.booleans())
@settings(max_examples=200)
def test_cut_is_exact_at_the_budget(key: bytes, budget: int, thinking: bool) -> None:
    plan = _plan(key, thinking)
    c = answers.complete(plan, CORPUS, budget=budget, eos_token_id=151645, stops=[])
    if plan.total_tokens > budget:
        assert c.finish_reason == "length"
        assert c.completion_tokens == budget
        assert c.matched_stop is None
    else:
        assert c.finish_reason == "stop"
        assert c.completion_tokens == plan.total_tokens
        assert c.matched_stop == 151645
    assert c.reasoning_tokens <= c.completion_tokens
    if thinking and c.completion_tokens < plan.think_tokens:  # cut inside the thinking
        assert c.content == "" and not c.think_closed
        assert c.reasoning_tokens == c.completion_tokens
    # the text is the token rule applied to the plan
    words = CORPUS.word_count(c.reasoning) + CORPUS.word_count(c.content)
    specials = (1 if c.thinking and c.completion_tokens else 0) + (1 if c.think_closed else 0)
    eos = 1 if c.finish_reason == "stop" else 0
    assert words + specials + eos == c.completion_tokens


@given(st.binary(min_size=32, max_size=32), st.integers(1, 5000), st.integers(1, 5000))
@settings(max_examples=100)
def test_shorter_budget_is_a_prefix(key: bytes, a: int, b: int) -> None:
    lo, hi = sorted((a, b))
    plan = _plan(key)
    short = answers.complete(plan, CORPUS, budget=lo, eos_token_id=1, stops=[])
    long = answers.complete(plan, CORPUS, budget=hi, eos_token_id=1, stops=[])
    assert answers.raw_text(long).startswith(answers.raw_text(short).rstrip(". "))


def test_stop_string_trims_content() -> None:
    plan = _plan(bytes(range(32)), thinking=False)
    full = answers.complete(plan, CORPUS, budget=100000, eos_token_id=1, stops=[])
    word = full.content.split()[3]
    c = answers.complete(plan, CORPUS, budget=100000, eos_token_id=1, stops=[word])
    assert c.finish_reason == "stop" and c.matched_stop == word
    assert word not in c.content and full.content.startswith(c.content)


# ------------------------------------------------------------- faults


def test_transient_faults_change_between_attempts() -> None:
    inj = FaultInjector(SimulatorConfig(error_rate=0.5))
    draws = [inj.draw(b"same prompt")[0] for _ in range(64)]
    assert Transient.ERROR in draws and Transient.NONE in draws
    again = FaultInjector(SimulatorConfig(error_rate=0.5))
    assert [again.draw(b"same prompt")[0] for _ in range(64)] == draws  # seeded


@given(st.floats(0, 1, exclude_max=True))
def test_fault_bands(u: float) -> None:
    cfg = SimulatorConfig(error_rate=0.1, stall_rate=0.2, abort_rate=0.3, empty_rate=0.25,
                          trivial_rate=0.25)
    t = transient_fault(cfg, u)
    e1, e2, e3 = 0.1, 0.1 + 0.2, 0.1 + 0.2 + 0.3  # the same float sums as the code
    expected = (Transient.ERROR if u < e1 else Transient.STALL if u < e2
                else Transient.ABORT if u < e3 else Transient.NONE)
    assert t is expected
    c = content_fault(cfg, u)
    assert c is (ContentFault.EMPTY if u < 0.25 else ContentFault.TRIVIAL if u < 0.5
                 else ContentFault.NONE)


# ------------------------------------------------------------- capacity rules


def test_rates() -> None:
    cfg = SimulatorConfig(decode_rate=50, speculative_accept_length=2, time_scale=10,
                          max_total_tok_s=1000, prefill_rate=1000)
    assert decode_rate_each(cfg, 1) == 50 * 2 * 10
    assert decode_rate_each(cfg, 100) == 1000 * 10 / 100
    assert math.isclose(prefill_seconds(cfg, 5000), 0.5)
    assert decode_rate_each(SimulatorConfig(zero_delay=True), 5) == float("inf")


# ------------------------------------------------------------- config <-> CLI


def test_config_round_trips_through_the_cli_flags() -> None:
    cfg = SimulatorConfig(port=1234, tool_call_parser="qwen25", reasoning_parser=None,
                          zero_delay=True, error_rate=0.25, crash_after=7,
                          empty_content="null", time_scale=500.0)
    ctx = sim_sglang.make_context("sim-sglang", to_cli_args(cfg))
    fields = {k: v for k, v in ctx.params.items() if k not in ("log_level", "log_format")}
    assert SimulatorConfig(**fields) == cfg


def test_invalid_config_is_rejected() -> None:
    with pytest.raises(ValueError):
        SimulatorConfig(error_rate=1.5).validate()
    with pytest.raises(ValueError):
        SimulatorConfig(speculative_accept_length=9, speculative_num_draft_tokens=4).validate()
