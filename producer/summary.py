"""Counts gathered while reading, and the closing tables.

The summary answers the seed operator's questions in one place: how many
prompts from each source, how many are multi-turn or carry tools, what was
skipped as a duplicate, and what was rejected and why.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from rich.console import Console
from rich.table import Table

from schemas.prompt import Category

CATEGORIES: tuple[Category, ...] = ("plain", "system-prompt", "multi-turn", "tools")


@dataclass(slots=True)
class SourceStats:
    name: str
    records: int = 0  # records read from the file (blank lines not counted)
    prompts: int = 0  # prompts accepted (a record may yield several: per-user-turn)
    by_category: Counter[str] = field(default_factory=Counter)
    formats: Counter[str] = field(default_factory=Counter)
    several_user_turns: int = 0  # accepted prompts whose context has >1 user turn
    duplicates: int = 0
    rejected: int = 0


@dataclass
class RejectExample:
    count: int
    first: str  # "file:line"


@dataclass
class Summary:
    sources: list[SourceStats]
    rejects: dict[str, RejectExample] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def prompts(self) -> int:
        return sum(s.prompts for s in self.sources)

    @property
    def duplicates(self) -> int:
        return sum(s.duplicates for s in self.sources)

    @property
    def rejected(self) -> int:
        return sum(s.rejected for s in self.sources)

    @property
    def records(self) -> int:
        return sum(s.records for s in self.sources)

    def reject(self, reason: str, where: str) -> None:
        example = self.rejects.get(reason)
        if example is None:
            self.rejects[reason] = RejectExample(1, where)
        else:
            example.count += 1


def sources_table(summary: Summary) -> Table:
    table = Table(title="prompts by source", title_justify="left")
    for column in ("source", "formats", "records", "prompts", *CATEGORIES,
                   ">1 user turn", "duplicates", "rejected"):
        table.add_column(column, justify="left" if column in ("source", "formats") else "right")
    total = SourceStats("total")
    for s in summary.sources:
        table.add_row(*_row(s))
        total.records += s.records
        total.prompts += s.prompts
        total.by_category.update(s.by_category)
        total.formats.update(s.formats)
        total.several_user_turns += s.several_user_turns
        total.duplicates += s.duplicates
        total.rejected += s.rejected
    if len(summary.sources) > 1:
        table.add_section()
        table.add_row(*_row(total), style="bold")
    return table


def _row(s: SourceStats) -> list[str]:
    formats = ", ".join(f"{name} {n:,}" if len(s.formats) > 1 else name
                        for name, n in s.formats.most_common())
    return [s.name, formats, f"{s.records:,}", f"{s.prompts:,}",
            *(f"{s.by_category.get(c, 0):,}" for c in CATEGORIES),
            f"{s.several_user_turns:,}", f"{s.duplicates:,}",
            f"{s.rejected:,}"]


def rejects_table(summary: Summary, rejects_path: str) -> Table:
    table = Table(title=f"rejected records (every one listed in {rejects_path})",
                  title_justify="left")
    table.add_column("reason")
    table.add_column("count", justify="right")
    table.add_column("first at")
    for reason, example in sorted(summary.rejects.items(), key=lambda kv: -kv[1].count):
        table.add_row(reason, f"{example.count:,}", example.first)
    return table


def print_summary(console: Console, summary: Summary, rejects_path: str) -> None:
    console.print(sources_table(summary))
    if summary.rejects:
        console.print(rejects_table(summary, rejects_path))
    for warning in summary.warnings:
        console.print(f"[yellow]warning:[/yellow] {warning}")
