"""Predictions per candidate max_tokens, and the estimate a run stores.

Both `tokenmill plan` (to print the table) and `tokenmill produce --plan` (to
store the prediction for the run's own max_tokens and GPU count in the spec)
go through `predict`, so the number `status` compares against is the number
the plan showed.
"""

from __future__ import annotations

from pathlib import Path

from schemas.plan import Curve, Plan, Prediction
from schemas.run import Estimate
from tokenmill.forecast import makespan
from tokenmill.forecast.lengths import LengthDistribution
from tokenmill.forecast.throughput import tokens_per_s

QUANTILES = 2000  # answer lengths standing in for the dataset in the makespan simulation


class PlanMismatch(ValueError):
    """The plan cannot answer for these settings (say, a larger max_tokens)."""


def predict(*, prompts: int, lengths: LengthDistribution, curve: Curve, concurrency: int,
            gpus: int, gpu_hour_cost: float, max_tokens: int, seed: int = 0) -> Prediction:
    """Truncation, tokens, hours and cost for `prompts` prompts with budget
    `max_tokens` on `gpus` servers, each holding `concurrency` in flight."""
    jobs = makespan.per_gpu_jobs(prompts, gpus)
    # as many quantiles as jobs (up to a cap), so the jobs' total is the mean's
    answer_lengths = makespan.busiest_gpu_lengths(
        lengths.quantiles(max_tokens, min(jobs, QUANTILES)), jobs, gpus)
    seconds = makespan.makespan_seconds(answer_lengths, jobs, concurrency,
                                        lambda m: tokens_per_s(curve, m), seed=seed)
    return makespan.prediction(
        max_tokens=max_tokens, truncated_share=lengths.truncated_share(max_tokens),
        prompts=prompts, output_tokens_per_prompt=lengths.mean_output_tokens(max_tokens),
        seconds=seconds, gpus=gpus, gpu_hour_cost=gpu_hour_cost)


def plan_lengths(plan: Plan) -> LengthDistribution:
    if plan.lengths is None or not plan.lengths.answers:
        raise PlanMismatch("the plan has no measured answer lengths (made without a server)")
    weights = {i: float(s.prompts) for i, s in enumerate(plan.dataset.strata)}
    return LengthDistribution(plan.lengths.answers, weights, plan.lengths.max_tokens)


def run_estimate(plan: Plan, *, max_tokens: int, gpus: int,
                 gpu_hour_cost: float | None = None) -> Estimate:
    """The estimate stored in a run spec by `produce --plan`: the plan's
    prediction for the run's max_tokens and GPU count."""
    price = plan.assumptions.gpu_hour_cost if gpu_hour_cost is None else gpu_hour_cost
    prompts = plan.dataset.prompts
    assumptions = plan.assumptions
    if assumptions.source == "flags":
        if assumptions.requests_per_s is None or assumptions.output_tokens is None:
            raise PlanMismatch("the plan's assumptions lack requests/s or output tokens")
        rps = assumptions.requests_per_s * gpus / assumptions.gpus  # per-GPU rate x GPUs
        p = makespan.from_rates(prompts=prompts, requests_per_s=rps,
                                output_tokens=assumptions.output_tokens, gpus=gpus,
                                gpu_hour_cost=price)
        return Estimate(requests_per_s=p.requests_per_s, output_tokens=p.output_tokens_per_prompt,
                        hours=p.hours, gpus=gpus, tokens_per_s=rps * assumptions.output_tokens,
                        cost=p.cost, source="plan")
    calibration = plan.calibration
    if calibration is None or calibration.curve is None:
        raise PlanMismatch("the plan has no fitted throughput curve")
    lengths = plan_lengths(plan)
    if max_tokens > lengths.max_tokens:
        raise PlanMismatch(
            f"the plan measured answers up to max_tokens {lengths.max_tokens}; for "
            f"--max-tokens {max_tokens} make a plan with --max-tokens {max_tokens}")
    concurrency = calibration.recommended_concurrency
    p = predict(prompts=prompts, lengths=lengths, curve=calibration.curve,
                concurrency=concurrency, gpus=gpus, gpu_hour_cost=price, max_tokens=max_tokens)
    return Estimate(requests_per_s=p.requests_per_s, output_tokens=p.output_tokens_per_prompt,
                    truncated_share=p.truncated_share, hours=p.hours, gpus=gpus,
                    concurrency=concurrency,
                    tokens_per_s=tokens_per_s(calibration.curve, concurrency) * gpus,
                    cost=p.cost, source="plan")


def input_differences(plan: Plan, files: tuple[Path, ...], multi_turn: str,
                      tools: str) -> list[str]:
    """What a run reads differently from what its plan read (warnings)."""
    out = []
    planned = sorted((f.name.rsplit("/", 1)[-1], f.size) for f in plan.dataset.inputs)
    given = sorted((f.name, f.stat().st_size) for f in files if f.is_file())
    if planned != given:
        out.append("the plan was made for other input files (names or sizes differ); "
                   "its estimate is stored anyway")
    if (plan.dataset.multi_turn, plan.dataset.tools) != (multi_turn, tools):
        out.append(f"the plan read the data with --multi-turn {plan.dataset.multi_turn} "
                   f"--tools {plan.dataset.tools}; this run uses --multi-turn {multi_turn} "
                   f"--tools {tools}")
    return out
