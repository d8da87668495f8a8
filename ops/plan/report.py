"""A plan on the terminal: dataset, calibration sweep, predictions, notes."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from schemas.plan import Plan
from tokenmill.forecast.table import predictions_table
from tokenmill.forecast.throughput import tokens_per_s


def render(plan: Plan) -> Group:
    parts: list[Table | Text] = []
    d = plan.dataset
    pt = plan.prompt_tokens
    sampled = sum(s.sampled for s in d.strata)
    parts.append(Text.from_markup(
        f"[bold]dataset[/] {d.prompts:,} prompts ({d.rejected:,} rejected, {d.duplicates:,} "
        f"duplicates; multi-turn {d.multi_turn}, tools {d.tools}); sample {sampled:,} from "
        f"{len(d.strata)} strata (source x category)\n"
        f"[bold]prompt tokens[/] {pt.mean:,.0f} per prompt, {pt.total:,.0f} in all "
        f"({'counted by the server' if pt.source == 'server' else 'estimated: chars/4'})"))
    c = plan.calibration
    if c is not None:
        sweep = Table(title=f"calibration: {c.server} ({c.seconds:.0f}s of a "
                            f"{c.time_budget_s:.0f}s budget, {c.requests:,} requests, "
                            f"{c.failures:,} failed{', INTERRUPTED' if c.interrupted else ''})")
        for column in ("concurrency", "held", "request-seconds", "tokens/s", "fitted"):
            sweep.add_column(column, justify="right")
        for level in c.levels:
            fitted = tokens_per_s(c.curve, level.concurrency) if c.curve else None
            mark = " <- knee" if level.concurrency == c.knee_concurrency else ""
            sweep.add_row(f"{level.concurrency}{mark}", f"{level.seconds:.1f}s",
                          f"{level.request_seconds:,.0f}", f"{level.tokens_per_s:,.0f}",
                          f"{fitted:,.0f}" if fitted is not None else "-")
        parts.append(sweep)
        plateau = f", plateau {c.curve.max_tokens_per_s:,.0f} tokens/s" if c.curve else ""
        limit = (f"; the server runs at most {c.server_max_running_requests}"
                 if c.server_max_running_requests else "")
        knee = (f"knee {c.knee_concurrency} (95% of the plateau) + 25%" if c.saturated
                else "the highest level: the plateau was NOT reached")
        parts.append(Text.from_markup(
            f"[bold]recommended concurrency[/] {c.recommended_concurrency} per GPU ({knee}), "
            f"{c.tokens_per_s:,.0f} output tokens/s per GPU{plateau}{limit}"))
    a = plan.assumptions
    parts.append(predictions_table(plan.predictions, prompts=d.prompts, gpus=a.gpus,
                                   gpu_hour_cost=a.gpu_hour_cost))
    for note in plan.notes:
        parts.append(Text(f"note: {note}", style="yellow"))
    return Group(*parts)
