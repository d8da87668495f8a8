"""Measurements -> a Plan: level rates, the fitted curve and its knee, the
sample's answer lengths, prompt tokens, and one prediction per candidate."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgspec

from ops.plan.calibrate import Request, SweepResult
from ops.plan.dataset import DatasetSample, SampledPrompt
from ops.plan.fit import fit_curve
from ops.plan.rates import LevelRates, Span, level_rates
from schemas.plan import (
    Answer,
    Assumptions,
    Calibration,
    Curve,
    Dataset,
    Lengths,
    Level,
    Outcome,
    Plan,
    Prediction,
    PromptTokens,
)
from schemas.prompt import PromptRecord
from sglang_sim import tokens as token_rule
from tokenmill.forecast import makespan
from tokenmill.forecast.estimate import predict
from tokenmill.forecast.lengths import LengthDistribution
from tokenmill.forecast.throughput import recommended_concurrency, tokens_per_s

_encoder = msgspec.json.Encoder()


@dataclass(frozen=True)
class Costing:
    gpus: int
    gpu_hour_cost: float
    candidates: tuple[int, ...]  # max_tokens to predict for, ascending
    seed: int = 0


@dataclass(frozen=True)
class ServerInfo:
    url: str
    model: str
    max_running_requests: int | None
    time_budget_s: float


# --------------------------------------------------------------- prompt tokens


def estimated_prompt_tokens(prompt: PromptRecord) -> int:
    """No tokenizer: ceil(chars / 4) + 4 per message, plus the tool block
    (the simulator's documented rule)."""
    chars = [len(m.content or "") + (len(_encoder.encode(m.tool_calls)) if m.tool_calls else 0)
             for m in prompt.messages]
    tools = len(_encoder.encode(prompt.tools)) if prompt.tools else 0
    return token_rule.prompt_tokens(chars, tools)


def _stratified_mean(values: Sequence[tuple[int, float]], dataset: Dataset) -> float | None:
    """Mean of (stratum, value) pairs, each stratum weighted by its prompts."""
    sums: dict[int, list[float]] = {}
    for stratum, value in values:
        sums.setdefault(stratum, []).append(value)
    weights = {s: dataset.strata[s].prompts for s in sums}
    total = sum(weights.values())
    if not total:
        return None
    return sum(weights[s] * sum(v) / len(v) for s, v in sums.items()) / total


def prompt_tokens_estimate(sample: DatasetSample) -> PromptTokens:
    mean = _stratified_mean([(p.stratum, estimated_prompt_tokens(p.prompt))
                             for p in sample.prompts], sample.dataset) or 0.0
    return PromptTokens(mean=mean, total=mean * sample.dataset.prompts, source="estimate")


# --------------------------------------------------------------- answers


def sample_answers(prompts: Sequence[SampledPrompt], sweep: SweepResult,
                   progress: Callable[[float, float], float]) -> list[Answer]:
    """One answer per sample prompt: its last non-repeat request that either
    finished or was cut short (failed, rejected and unsent prompts have none)."""
    last: dict[int, Request] = {}
    for request in sweep.requests:
        if not request.repeat and request.outcome not in ("failed", "rejected", "running"):
            last[request.sample] = request
    answers = []
    for index, request in sorted(last.items()):
        stratum = prompts[index].stratum
        if request.outcome == "unfinished":
            assert request.end is not None
            answers.append(Answer(stratum, max(1, round(progress(request.start, request.end))),
                                  "unfinished"))
        else:
            outcome: Outcome = "length" if request.outcome == "length" else "stop"
            answers.append(Answer(stratum, request.completion_tokens, outcome))
    return answers


# --------------------------------------------------------------- plans


def calibrated_plan(sample: DatasetSample, sweep: SweepResult, server: ServerInfo,
                    costing: Costing) -> Plan:
    dataset = sample.dataset
    rates = _level_rates(sweep)
    calibration, calibration_notes = _calibration(sweep, server, rates)
    answers = sample_answers(sample.prompts, sweep, rates.progress)
    max_tokens = costing.candidates[-1]
    notes = _sweep_notes(sample, sweep, answers) + calibration_notes
    finished = sweep.finished()
    served = _stratified_mean([(sample.prompts[r.sample].stratum, float(r.prompt_tokens))
                               for r in finished if not r.repeat and r.prompt_tokens > 0], dataset)
    prompt_tokens = (PromptTokens(mean=served, total=served * dataset.prompts, source="server")
                     if served else prompt_tokens_estimate(sample))
    assumptions = Assumptions(gpus=costing.gpus, gpu_hour_cost=costing.gpu_hour_cost,
                              source="calibration",
                              concurrency=calibration.recommended_concurrency,
                              tokens_per_s_per_gpu=calibration.tokens_per_s)
    predictions: tuple[Prediction, ...] = ()
    if answers and calibration.curve is not None:
        distribution = LengthDistribution(answers, {i: s.prompts for i, s in
                                                    enumerate(dataset.strata)}, max_tokens)
        predictions = tuple(predict(prompts=dataset.prompts, lengths=distribution,
                                    curve=calibration.curve,
                                    concurrency=calibration.recommended_concurrency,
                                    gpus=costing.gpus, gpu_hour_cost=costing.gpu_hour_cost,
                                    max_tokens=m, seed=costing.seed)
                            for m in costing.candidates)
    elif not answers:
        notes.append("no sample answer was measured: no prediction")
    else:
        notes.append("no throughput was measured (no request finished): no prediction")
    return Plan(created_at=time.time(), dataset=dataset, prompt_tokens=prompt_tokens,
                assumptions=assumptions, predictions=predictions, calibration=calibration,
                lengths=Lengths(max_tokens=max_tokens, answers=tuple(answers)),
                notes=tuple(notes))


def _level_rates(sweep: SweepResult) -> LevelRates:
    spans = [Span(r.start, r.end, r.completion_tokens if r.outcome not in
                  ("failed", "rejected", "unfinished") else None)
             for r in sweep.requests if r.end is not None]
    if not spans or not sweep.levels:
        raise ValueError("calibration measured nothing (no request was sent)")
    return level_rates(spans, [span.concurrency for span in sweep.levels])


def _calibration(sweep: SweepResult, server: ServerInfo,
                 rates: LevelRates) -> tuple[Calibration, list[str]]:
    """The levels, the fitted curve and the recommended concurrency."""
    notes = []
    visited = [span.concurrency for span in sweep.levels]
    levels = tuple(Level(concurrency=s.concurrency, seconds=s.end - s.start,
                         request_seconds=rs, tokens_per_s=t)
                   for s, rs, t in zip(sweep.levels, rates.request_seconds,
                                       rates.throughput(visited), strict=True))
    curve: Curve | None
    try:
        curve = fit_curve([(lv.concurrency, lv.tokens_per_s, lv.request_seconds)
                           for lv in levels])
    except ValueError:
        curve = None
    if curve is not None:
        knee, recommended, saturated = recommended_concurrency(curve, visited[-1])
        rate = tokens_per_s(curve, recommended)
        if not saturated:
            notes.append(f"throughput still grew at concurrency {visited[-1]}, the highest "
                         "level measured: the server may do more (raise --max-concurrency)")
    else:
        best = max(levels, key=lambda lv: lv.tokens_per_s)
        knee = recommended = best.concurrency
        saturated, rate = False, best.tokens_per_s
        notes.append("too few levels measured to fit a curve: using the best level measured")
    calibration = Calibration(
        server=server.url, model=server.model,
        server_max_running_requests=server.max_running_requests,
        time_budget_s=server.time_budget_s, seconds=sweep.ended - sweep.started,
        requests=len(sweep.finished()),
        failures=sum(1 for r in sweep.requests if r.outcome in ("failed", "rejected")),
        interrupted=sweep.interrupted, levels=levels, curve=curve, knee_concurrency=knee,
        recommended_concurrency=recommended, tokens_per_s=rate, saturated=saturated)
    return calibration, notes


def _sweep_notes(sample: DatasetSample, sweep: SweepResult, answers: list[Answer]) -> list[str]:
    notes = []
    if sweep.interrupted:
        notes.append("interrupted (Ctrl-C): this plan is what was measured until then")
    errors = [r.error for r in sweep.requests if r.outcome == "failed"]
    if sweep.stopped_for_failures:
        notes.append(f"calibration stopped: {len(errors)} requests failed (first error: "
                     f"{errors[0][:160] if errors else '-'})")
    unfinished = sum(1 for a in answers if a.outcome == "unfinished")
    if unfinished:
        notes.append(f"{unfinished} sample answers were still running at the end; they count "
                     "as longer than the tokens they had reached (raise --time-budget to "
                     "measure them)")
    if sweep.unsent:
        notes.append(f"{sweep.unsent} of {len(sample.prompts)} sample prompts were never sent")
    answered = {r.sample for r in sweep.requests
                if not r.repeat and r.outcome not in ("failed", "rejected")}
    failed = {r.sample: r.error for r in sweep.requests
              if not r.repeat and r.outcome == "failed" and r.sample not in answered}
    if failed:
        first = next(iter(failed.values()))
        notes.append(f"{len(failed)} sample prompts failed on every attempt (first error: "
                     f"{first[:160]}); they are not in the lengths")
    rejected = {r.sample: r.error for r in sweep.requests if r.outcome == "rejected"}
    if rejected:
        first = next(iter(rejected.values()))
        notes.append(f"{len(rejected)} sample prompts were rejected by the server (first: "
                     f"{first[:160]}); a run would record them as failures")
    return notes


def flags_plan(sample: DatasetSample, *, requests_per_s: float, output_tokens: float,
               costing: Costing) -> Plan:
    """No server: the operator's own rate and answer length."""
    dataset = sample.dataset
    prediction = makespan.from_rates(prompts=dataset.prompts, requests_per_s=requests_per_s,
                                     output_tokens=output_tokens, gpus=costing.gpus,
                                     gpu_hour_cost=costing.gpu_hour_cost)
    assumptions = Assumptions(gpus=costing.gpus, gpu_hour_cost=costing.gpu_hour_cost,
                              source="flags", requests_per_s=requests_per_s,
                              output_tokens=output_tokens)
    return Plan(created_at=time.time(), dataset=dataset,
                prompt_tokens=prompt_tokens_estimate(sample), assumptions=assumptions,
                predictions=(prediction,),
                notes=("no server measured: hours, tokens and cost follow from "
                       "--estimate-rps and --estimate-output-tokens; truncation is unknown",))
