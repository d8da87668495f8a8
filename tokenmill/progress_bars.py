"""The rich progress bar every long command shows on stderr: records and
records/s, elapsed time and ETA. Off when stderr is not a terminal, unless
asked for."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text


class RateColumn(ProgressColumn):
    """Records per second, whatever the bar counts (bytes, say): the task's
    `records` field when it has one."""

    def render(self, task: Task) -> Text:
        records = task.fields.get("records", task.completed)
        elapsed = task.elapsed or 0.0
        rate = records / elapsed if elapsed > 0 else 0.0
        return Text(f"{records:>9,} {rate:>7,.0f}/s", style="progress.data.speed")


def progress_bars(console: Console, enabled: bool | None) -> Progress:
    """`enabled` None: when the console is a terminal."""
    return Progress(
        TextColumn("[bold]{task.description:<10}"), BarColumn(bar_width=24), TaskProgressColumn(),
        RateColumn(), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
        console=console, disable=not (console.is_terminal if enabled is None else enabled),
    )
