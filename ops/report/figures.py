"""The numbers behind every chart of `tokenmill report`: what `figures.json`
holds and what the page draws (ops/report/render.py). Plain msgspec Structs,
so the JSON beside the page is exactly what was drawn."""

from __future__ import annotations

import msgspec


class Histogram(msgspec.Struct, frozen=True):
    """counts[i] values in [edges[i], edges[i+1]); values past the last edge
    are counted in the last bin, so the counts sum to the values seen."""

    edges: list[float]
    counts: list[int]


class LengthRow(msgspec.Struct, frozen=True):
    """Output tokens of one category's answers (a conversation's steps each)."""

    category: str
    answers: int
    truncated: int  # finish_reason "length": cut at max_tokens
    histogram: Histogram


class Breakdown(msgspec.Struct, frozen=True):
    """Counts of `keys` (finish reasons, DLQ reasons, ...) per row (a
    category or a source); rows most first."""

    by: str  # "category" | "source"
    keys: list[str]
    rows: list[tuple[str, dict[str, int]]]


class Series(msgspec.Struct, frozen=True):
    name: str
    points: list[tuple[float, float]]  # (seconds since the run's start, value)


class GpuAccept(msgspec.Struct, frozen=True):
    """A worker's accept length, from its progress counters."""

    instance: str
    tokens: int  # output tokens of the requests that reported an accept length
    mean: float  # accept length, weighted by those tokens


class Timeline(msgspec.Struct, frozen=True):
    """From the runs' progress records (every commit carries cumulative
    counters): output tokens/s per GPU between commits, and answers so far
    against the plan's prediction."""

    throughput: list[Series]  # per GPU (consumer instance)
    progress: list[Series]  # per run: "<run> generated", "<run> plan"
    snapshots: int  # progress records read
    planned: bool  # a run carried a prediction (`produce --plan` or --estimate-*)
    left_out: str = ""  # why there is no timeline, when it was left out on purpose


class Figures(msgspec.Struct, frozen=True):
    title: str
    runs: list[str]
    max_tokens: list[int]  # the runs' caps, marked on the length histograms
    records: int  # results read: accepted (S3) and dead-lettered
    accepted: int
    dead_letters: int
    lengths: list[LengthRow]
    finish_by_category: Breakdown
    finish_by_source: Breakdown
    dlq_by_category: Breakdown
    dlq_by_source: Breakdown
    thinking: Breakdown  # "present" / "absent" per category
    accept_lengths: Histogram | None  # None: no request reported speculative stats
    accept_by_gpu: list[GpuAccept]
    timeline: Timeline
    conversations: int
    turns: Histogram | None  # user turns answered per conversation
    tool_rounds: Histogram | None  # assistant steps that called tools, per conversation
    notes: list[str] = []  # what the page says above the charts (run in progress, ...)
    v: int = 1


def encode(figures: Figures) -> bytes:
    return msgspec.json.format(msgspec.json.encode(figures), indent=1)


def decode(data: bytes) -> Figures:
    return msgspec.json.decode(data, type=Figures)
