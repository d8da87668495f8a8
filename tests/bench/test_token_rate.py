"""The server-side view the benchmarks split a side's wall clock with: when
generation started and ended, and the steady rate between."""

from __future__ import annotations

from bench.token_rate import TokenRate


def meter(samples: list[tuple[float, float]]) -> TokenRate:
    rate = TokenRate("http://unused")
    rate.samples = samples
    return rate


def test_the_active_window_runs_from_the_first_rise_to_the_final_value() -> None:
    # idle until t=2 (a counter left at 500 by an earlier run), 100 tok/s to
    # t=12, then idle again while the client's tail runs
    samples = [(t * 0.5, 500.0) for t in range(5)]
    samples += [(2 + t * 0.5, 500.0 + 50 * (t + 1)) for t in range(20)]
    samples += [(12.5 + t * 0.5, 1500.0) for t in range(6)]
    rate = meter(samples)
    assert rate.first_token_at() == 2.0
    assert rate.last_token_at() == 11.5
    assert rate.active_s() == 9.5
    assert rate.steady_rate() == 100


def test_a_counter_that_never_rose_has_no_window() -> None:
    rate = meter([(0.0, 7.0), (0.5, 7.0)])
    assert rate.first_token_at() != rate.first_token_at()  # nan


def test_split_details_pairs_each_run_with_its_own_baseline() -> None:
    from bench.consume_sides import Side
    from bench.token_rate import Measured, split_details

    def run(wall_s: float, steady: float, active_s: float) -> Measured:
        return Measured(Side(wall_s, 1.0, 10, 100), steady, active_s)

    details = split_details([run(100, 110, 98), run(100, 90, 96)],
                            [run(99, 100, 98), run(99, 100, 98)],
                            steady_method="s", fixed_method="f")
    assert details["steady_state_ratio"] == 1.0  # median of 1.1 and 0.9
    assert details["fixed_cost_s_tokenmill"] == [2, 4]
    assert details["fixed_cost_share_tokenmill"] == [0.02, 0.04]
    assert details["fixed_cost_s_baseline"] == [1, 1]
