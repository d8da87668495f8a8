"""The seed-run benchmark's figure computations (bench/seed_figures.py), without a broker."""

from __future__ import annotations

import math
import os

import pytest

from bench import seed_figures as f
from bench import seed_plots, seed_sampler


def test_middle_window_drops_a_tenth_at_each_end() -> None:
    assert f.middle_window(100.0, 200.0) == pytest.approx((110.0, 190.0))
    assert f.middle_window(0.0, 10.0, 1.0) == (0.0, 10.0)
    with pytest.raises(ValueError):
        f.middle_window(10.0, 0.0)


def test_busy_share_counts_only_the_window_and_caps_at_one() -> None:
    running = [(0.0, 0.0), (1.0, 64.0), (2.0, 32.0), (3.0, 70.0), (4.0, 0.0)]
    assert f.busy_share(running, 64, 1.0, 3.0) == pytest.approx((1.0 + 0.5 + 1.0) / 3)
    assert math.isnan(f.busy_share(running, 64, 10.0, 20.0))


def test_growth_compares_the_end_with_the_value_at_a_tenth() -> None:
    rss = [(float(t), 100.0 + (50.0 if t >= 5 else 0.0)) for t in range(0, 101)]
    assert f.growth(rss, 0.0, 100.0) == pytest.approx(1.0)  # grew before 10%, flat after
    leak = [(float(t), 100.0 + t) for t in range(0, 101)]
    assert f.growth(leak, 0.0, 100.0) == pytest.approx(200.0 / 110.0)
    assert f.growth(leak, 0.0, 50.0) == pytest.approx(150.0 / 105.0)  # samples after end ignored


def test_slope_per_hour() -> None:
    assert f.slope_per_hour([(0.0, 10.0), (1800.0, 15.0), (3600.0, 20.0)], 0.0) == \
        pytest.approx(10.0)
    assert f.slope_per_hour([(0.0, 10.0), (3600.0, 10.0)], 0.0) == pytest.approx(0.0)
    assert math.isnan(f.slope_per_hour([(0.0, 1.0)], 0.0))


def test_percentile_interpolates() -> None:
    assert f.percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert f.percentile([5.0], 99) == 5.0
    assert f.percentile([3.0, 1.0, 2.0], 100) == 3.0
    assert math.isnan(f.percentile([], 50))


def test_rates_and_rises_of_a_counter() -> None:
    counter = [(0.0, 0.0), (1.0, 0.0), (2.0, 10.0), (4.0, 30.0), (5.0, 30.0)]
    assert f.rates(counter) == [(1.0, 0.0), (2.0, 10.0), (4.0, 10.0), (5.0, 0.0)]
    assert f.first_rise(counter, 0.5) == 2.0
    assert f.last_rise(counter) == 4.0
    assert f.first_rise(counter, 4.5) is None


def test_at_fractions() -> None:
    assert f.at_fractions(913_786, [0.01, 0.5, 1.0]) == [9138, 456893, 913786]
    assert f.at_fractions(10, [0.0]) == [1]


def test_lost_and_duplicated_by_id() -> None:
    assert f.lost_and_duplicated(["a", "b", "c"], ["a", "b", "c"]) == (0, 0, 0)
    assert f.lost_and_duplicated(["a", "b", "c"], ["a", "a", "a", "x"]) == (2, 2, 1)


def test_a_prometheus_page_is_read_by_name_summed_over_labels() -> None:
    page = ("# HELP sglang:num_running_reqs The number of running requests.\n"
            "# TYPE sglang:num_running_reqs gauge\n"
            'sglang:num_running_reqs{model_name="m"} 64.0\n'
            'sglang:num_requests_total{model_name="m"} 10.0\n'
            'sglang:num_requests_total{model_name="n"} 5.0\n'
            "sglang:num_queue_reqs 8.0\n"
            "tokenmill_consumer_in_flight 72.0\n")
    assert seed_sampler.parse_metrics(page) == {"running": 64.0, "requests": 15.0}
    assert seed_sampler.parse_metrics(page, seed_sampler.WORKER_METRICS) == {"in_flight": 72.0}


def test_a_process_reads_its_own_usage() -> None:
    usage = seed_sampler.proc_usage(os.getpid())
    assert usage is not None and usage[0] > 0 and usage[1] > 0


def test_smoothing_is_a_trailing_mean() -> None:
    points = [(0.0, 0.0), (1.0, 2.0), (2.0, 4.0), (3.0, 6.0)]
    assert seed_plots.smooth(points, 1.0) == [(0.0, 0.0), (1.0, 1.0), (2.0, 3.0), (3.0, 5.0)]
    assert seed_plots.smoothing_s(0.0, 100.0) == 2.0
    assert seed_plots.smoothing_s(0.0, 1500.0) == 15.0


def test_a_figure_without_samples_is_a_miss_not_a_nan() -> None:
    from bench.bench_seed_run import UNMEASURED, finite
    from bench.figures import Figure

    def figure(target: str, value: float) -> Figure:
        return Figure(name="n", unit="x", tokenmill=value, baseline=None, baseline_name=None,
                      ratio=None, target=target, met=True, method="m")

    assert finite(figure("<= 1.1", 1.0)) == figure("<= 1.1", 1.0)
    upper = finite(figure("<= 1.1", math.nan))
    assert upper.tokenmill == UNMEASURED and not upper.met and upper.details["notes"]
    assert finite(figure(">= 0.99", math.nan)).tokenmill == 0.0


def test_the_median_of_paired_ratios_pairs_runs_by_position() -> None:
    from bench.figures import median_paired_ratio

    # a slow second pair slows both of its sides: the pairs agree at 0.9
    assert median_paired_ratio([90, 45, 91], [100, 50, 100]) == 0.9
    with pytest.raises(ValueError):
        median_paired_ratio([1.0], [1.0, 2.0])
