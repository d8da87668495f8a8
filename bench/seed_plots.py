"""The plots of bench/bench_seed_run.py (matplotlib, PNG; `pip install -e
'.[bench]'`): per-GPU throughput and busy share over time for both sides,
RSS over time per process, `status` and done-check latency over the run.
Time is seconds since each side's launch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.seed_figures import Series, rates


def smoothing_s(t0: float, t1: float) -> float:
    """The averaging window of a plot: 1% of the run, at least 2 s."""
    return max(2.0, (t1 - t0) / 100)


def smooth(series: Series, window_s: float) -> list[tuple[float, float]]:
    """Trailing mean over `window_s` (a simple moving average, for reading)."""
    out: list[tuple[float, float]] = []
    start, total = 0, 0.0
    for i, (t, v) in enumerate(series):
        total += v
        while series[start][0] < t - window_s:
            total -= series[start][1]
            start += 1
        out.append((t, total / (i - start + 1)))
    return out


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plot(ax: Any, series: Series, t0: float, **style: Any) -> None:
    ax.plot([t - t0 for t, _ in series], [v for _, v in series], **style)


def gpus(path: Path, sides: Mapping[str, tuple[float, float]],
         gpu: Mapping[str, Mapping[str, Series]], cap: int) -> Path:
    """Per-GPU tokens/s (top) and busy share (bottom), one column per side;
    `sides`: name -> (launch, end)."""
    plt = _pyplot()
    fig, axes = plt.subplots(2, len(sides), figsize=(7 * len(sides), 8), squeeze=False,
                             sharey="row")
    for col, (side, (t0, t1)) in enumerate(sides.items()):
        window_s = smoothing_s(t0, t1)
        for name, metrics in gpu.items():
            window = [(t, v) for t, v in metrics.get("tokens", []) if t0 <= t <= t1 + 5]
            _plot(axes[0][col], smooth(rates(window), window_s), t0, label=name,
                  linewidth=0.8)
            busy = [(t, v / cap) for t, v in metrics.get("running", []) if t0 <= t <= t1 + 5]
            _plot(axes[1][col], smooth(busy, window_s), t0, label=name, linewidth=0.8)
        axes[0][col].set_title(f"{side}: generated tokens/s per GPU ({window_s:.0f} s mean)")
        axes[1][col].set_title(f"{side}: busy share (running / {cap} slots)")
        axes[1][col].set_xlabel("seconds since launch")
        axes[1][col].set_ylim(0, 1.05)
    axes[0][0].legend(fontsize="small", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def rss(path: Path, t0: float, series: Mapping[str, Series]) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 6))
    for name, points in sorted(series.items()):
        _plot(ax, [(t, v / 2**20) for t, v in points], t0, label=name, linewidth=0.8)
    ax.set_title("resident set size per process (tokenmill side)")
    ax.set_xlabel("seconds since launch")
    ax.set_ylabel("MiB")
    ax.legend(fontsize="small", ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def latency(path: Path, t0: float, status: Sequence[tuple[float, float]],
            checks: Sequence[tuple[float, float]], limit_s: float) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 5))
    _plot(ax, status, t0, marker="o", label="tokenmill status --json (process launch to exit)")
    _plot(ax, checks, t0, linewidth=0.6, label="worker done-check (run_done.look)")
    ax.axhline(limit_s, color="red", linestyle="--", linewidth=0.8, label=f"{limit_s:g} s")
    ax.set_xlabel("seconds since launch")
    ax.set_ylabel("seconds")
    ax.set_title("latency of `status` and of the done-check over the run")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def workers(path: Path, t0: float, t1: float,
            series: Mapping[str, Mapping[str, Series]]) -> Path:
    """Each worker's requests in flight and results waiting to commit (its
    own /metrics): where a GPU's missing requests are."""
    plt = _pyplot()
    keys = ("in_flight", "waiting_results", "lag")
    fig, axes = plt.subplots(len(keys), 1, figsize=(10, 3.2 * len(keys)), sharex=True)
    window_s = smoothing_s(t0, t1)
    for ax, key in zip(axes, keys, strict=True):
        for name, metrics in sorted(series.items()):
            points = [(t, v) for t, v in metrics.get(key, []) if t0 <= t <= t1 + 5]
            _plot(ax, smooth(points, window_s), t0, label=name, linewidth=0.8)
        ax.set_title(f"tokenmill_consumer_{key} per worker ({window_s:.0f} s mean)")
    axes[0].legend(fontsize="small", ncol=4)
    axes[-1].set_xlabel("seconds since launch")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
