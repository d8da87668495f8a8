"""`tokenmill spot-check --summary`: the table the seed run's operator built
by hand - prompt diversity by category and source, reasoning and tool-call
shares, the tool-spec formats of tool prompts, finish reasons, output
lengths, failures and where records go - computed from a sample of
committed records (`summarize`, pure) and rendered with rich (`render`).

Every cell is a `rich.text.Text`, so source names are printed verbatim.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import msgspec
from rich.console import Group
from rich.table import Table
from rich.text import Text

from ops.destination import route
from ops.verbatim import excerpt
from schemas import Completion, CompletionRecord, Failure, RunSpec

TOP_SOURCES = 15
NAME_WIDTH = 60


class Share(msgspec.Struct, frozen=True):
    name: str
    count: int
    share: float  # of the table's whole (see the field that holds it)


class Lengths(msgspec.Struct, frozen=True):
    """Completion tokens; percentiles by nearest rank (values that occur)."""

    min: int
    median: int
    p95: int
    max: int


class Summary(msgspec.Struct, frozen=True):
    records: int
    completions: int
    failures: int
    prompts: int  # records that carry a prompt (all but `invalid` failures)
    categories: list[Share]  # of prompts
    sources: list[Share]  # of prompts, most first
    with_reasoning: int  # completions with non-blank reasoning_content
    with_tool_calls: int  # completions that called a tool
    tool_prompts: int  # prompts that offer tools (structured, or left as text)
    tool_prompts_structured: int  # ... whose tools are a structured `tools` field
    tool_prompts_with_calls: int  # ... answered with a tool call
    tool_formats: list[Share]  # input format of the tool prompts, of tool prompts
    finish_reasons: list[Share]  # of completions
    completion_tokens: Lengths | None  # None without completions
    failure_kinds: list[Share]  # of records
    routes: list[Share]  # "S3" or "dead-letter: <reason>", of records


def nearest_rank(ordered: Sequence[int], percent: float) -> int:
    """The percentile of sorted values by nearest rank."""
    if not ordered:
        raise ValueError("no values")
    rank = max(1, math.ceil(percent / 100 * len(ordered)))
    return ordered[rank - 1]


def lengths(values: Sequence[int]) -> Lengths | None:
    if not values:
        return None
    ordered = sorted(values)
    return Lengths(ordered[0], nearest_rank(ordered, 50), nearest_rank(ordered, 95), ordered[-1])


def shares(counts: Counter[str], whole: int) -> list[Share]:
    """Most first, then by name; shares of `whole`."""
    return [Share(name, count, count / whole if whole else 0.0)
            for name, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def _blank(text: str | None) -> bool:
    return text is None or not text.strip()


def summarize(records: Sequence[CompletionRecord], spec: RunSpec) -> Summary:
    """The summary of these records (pure)."""
    completions = [r for r in records if isinstance(r, Completion)]
    failures = [r for r in records if isinstance(r, Failure)]
    prompted = [r for r in records if not (isinstance(r, Failure) and r.failure == "invalid")]
    tool_prompts = [r for r in prompted if r.prompt.tools or r.prompt.category == "tools"]
    routes: Counter[str] = Counter()
    for record in records:
        found = route(record, spec)
        routes["S3" if found.target == "s3" else f"dead-letter: {found.reason}"] += 1
    return Summary(
        records=len(records),
        completions=len(completions),
        failures=len(failures),
        prompts=len(prompted),
        categories=shares(Counter(r.prompt.category for r in prompted), len(prompted)),
        sources=shares(Counter(r.prompt.source for r in prompted), len(prompted)),
        with_reasoning=sum(1 for r in completions if not _blank(r.reasoning_content)),
        with_tool_calls=sum(1 for r in completions if r.tool_calls),
        tool_prompts=len(tool_prompts),
        tool_prompts_structured=sum(1 for r in tool_prompts if r.prompt.tools),
        tool_prompts_with_calls=sum(1 for r in tool_prompts
                                    if isinstance(r, Completion) and r.tool_calls),
        tool_formats=shares(Counter(r.prompt.format for r in tool_prompts), len(tool_prompts)),
        finish_reasons=shares(Counter(r.finish_reason for r in completions), len(completions)),
        completion_tokens=lengths([r.usage.completion_tokens for r in completions]),
        failure_kinds=shares(Counter(r.failure for r in failures), len(records)),
        routes=shares(routes, len(records)),
    )


# -- rendering -----------------------------------------------------------------


def _pct(part: float) -> Text:
    return Text(f"{100 * part:.1f}%", justify="right")


def _count(value: int) -> Text:
    return Text(f"{value:,}", justify="right")


def _ratio(part: int, whole: int) -> Text:
    return Text(f"{part:,} of {whole:,}" + (f" ({100 * part / whole:.1f}%)" if whole else ""))


def share_table(title: str, name: str, rows: Sequence[Share], limit: int | None = None) -> Table:
    table = Table(title=Text(title), title_justify="left")
    table.add_column(Text(name))
    table.add_column(Text("count"), justify="right")
    table.add_column(Text("share"), justify="right")
    shown = rows if limit is None else rows[:limit]
    for row in shown:
        table.add_row(Text(excerpt(row.name, NAME_WIDTH)), _count(row.count), _pct(row.share))
    if len(rows) > len(shown):
        rest = rows[len(shown):]
        table.add_row(Text(f"({len(rest)} more)", style="dim"),
                      _count(sum(r.count for r in rest)), _pct(sum(r.share for r in rest)))
    if not rows:
        table.add_row(Text("-"), _count(0), Text("-"))
    return table


def render(summary: Summary, sampled_from: str) -> Group:
    """The summary as rich tables; `sampled_from` says what was read."""
    head = Table(title=Text(f"Summary of {summary.records:,} committed records "
                            f"({sampled_from})"), title_justify="left", show_header=False)
    head.add_column(Text("what"), style="bold")
    head.add_column(Text("value"))
    head.add_row(Text("completions / failures"),
                 Text(f"{summary.completions:,} / {summary.failures:,}"))
    head.add_row(Text("with reasoning"), _ratio(summary.with_reasoning, summary.completions))
    head.add_row(Text("with tool calls"), _ratio(summary.with_tool_calls, summary.completions))
    head.add_row(Text("prompts offering tools"), _ratio(summary.tool_prompts, summary.prompts))
    head.add_row(Text("  tools as a structured field"),
                 _ratio(summary.tool_prompts_structured, summary.tool_prompts))
    head.add_row(Text("  answered with a tool call"),
                 _ratio(summary.tool_prompts_with_calls, summary.tool_prompts))
    lengths_ = summary.completion_tokens
    head.add_row(Text("output tokens min / median / p95 / max"),
                 Text(f"{lengths_.min:,} / {lengths_.median:,} / {lengths_.p95:,} / "
                      f"{lengths_.max:,}" if lengths_ else "-"))
    return Group(
        head,
        share_table("Prompts by category", "category", summary.categories),
        share_table("Prompts by source", "source", summary.sources, TOP_SOURCES),
        share_table("Tool prompts by format", "tool-spec format", summary.tool_formats),
        share_table("Finish reasons (of completions)", "finish reason", summary.finish_reasons),
        share_table("Failures by kind (of records)", "kind", summary.failure_kinds),
        share_table("Where records go (of records)", "destination", summary.routes),
    )
