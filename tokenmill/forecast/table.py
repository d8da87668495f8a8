"""The predictions table, as `tokenmill plan` and `tokenmill produce` print it."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
from rich.console import Group
from rich.table import Table
from rich.text import Text

from schemas.plan import Prediction
from schemas.run import Estimate
from tokenmill.forecast import makespan


def duration_text(hours: float) -> str:
    """45.2 h; 16.5 days; 12 min; 40 s."""
    if hours < 1 / 60:
        return f"{hours * 3600:.0f} s"
    if hours < 1:
        return f"{hours * 60:.0f} min"
    if hours < 72:
        return f"{hours:.1f} h"
    return f"{hours / 24:.1f} days"


def count_text(value: float) -> str:
    """1.2M, 3.4B: token totals are large."""
    for limit, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if value >= limit:
            return f"{value / limit:.1f}{suffix}"
    return f"{value:.0f}"


def cost_text(cost: float) -> str:
    return f"${cost:,.2f}" if cost < 100 else f"${cost:,.0f}"


def predictions_table(predictions: Sequence[Prediction], *, prompts: int, gpus: int,
                      gpu_hour_cost: float, title: str | None = None) -> Table:
    table = Table(title=title or f"{prompts:,} prompts on {gpus} GPU(s) at "
                                 f"${gpu_hour_cost:,.2f} per GPU-hour")
    for column in ("max_tokens", "truncated", "tokens/answer", "output tokens", "requests/s",
                   "time", "GPU-hours", "cost"):
        table.add_column(column, justify="right")
    for p in predictions:
        table.add_row(
            f"{p.max_tokens:,}" if p.max_tokens is not None else "-",
            f"{100 * p.truncated_share:.1f}%" if p.truncated_share is not None else "?",
            f"{p.output_tokens_per_prompt:,.0f}", count_text(p.output_tokens),
            f"{p.requests_per_s:,.2f}", duration_text(p.hours), f"{p.gpu_hours:,.1f}",
            cost_text(p.cost))
    return table


def forecast(estimate: Estimate, *, prompts: int, gpus: int, gpu_hour_cost: float,
             max_tokens: int) -> Group | Text:
    """A run's estimate as hours, tokens and cost for its prompts (what
    `produce` prints after reading them)."""
    rps = estimate.requests_per_s
    if not rps:
        return Text("")
    if estimate.output_tokens is None:
        return Text(f"forecast: {prompts:,} prompts at {rps:,.2f} requests/s take "
                    f"{duration_text(prompts / rps / 3600)} (give --estimate-output-tokens "
                    "for tokens and cost)")
    p = makespan.from_rates(prompts=prompts, requests_per_s=rps,
                            output_tokens=estimate.output_tokens, gpus=gpus,
                            gpu_hour_cost=gpu_hour_cost)
    p = msgspec.structs.replace(p, max_tokens=max_tokens,
                                truncated_share=estimate.truncated_share)
    source = ("the plan" if estimate.source == "plan"
              else "--estimate-rps / --estimate-output-tokens")
    parts: list[Table | Text] = [predictions_table(
        [p], prompts=prompts, gpus=gpus, gpu_hour_cost=gpu_hour_cost,
        title=f"forecast from {source}: {prompts:,} prompts on {gpus} GPU(s)")]
    if estimate.concurrency:
        parts.append(Text(f"the plan assumes --concurrency {estimate.concurrency} per worker "
                          f"({estimate.tokens_per_s or 0:,.0f} output tokens/s in all)"))
    return Group(*parts)
