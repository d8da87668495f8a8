from hypothesis import given
from hypothesis import strategies as st

from consumer.backoff import RetryPolicy
from consumer.concurrency import AutoBounds, ServerLoad, next_limit, parse_metrics

SGLANG_METRICS = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="Qwen/Qwen3-8B",\
pp_rank="0",tp_rank="0"} 48.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="Qwen/Qwen3-8B",pp_rank="0",tp_rank="0"} 3.0
sglang:token_usage{engine_type="unified",model_name="Qwen/Qwen3-8B",pp_rank="0",tp_rank="0"} 0.71
sglang:gen_throughput{engine_type="unified",model_name="Qwen/Qwen3-8B",\
pp_rank="0",tp_rank="0"} 3650.5
sglang:spec_accept_length{engine_type="unified",model_name="Qwen/Qwen3-8B",\
pp_rank="0",tp_rank="0"} 3.08
sglang:num_requests_total{model_name="Qwen/Qwen3-8B"} 2293.0
"""


def test_parse_sglang_metrics() -> None:
    load = parse_metrics(SGLANG_METRICS)
    assert load == ServerLoad(running=48.0, queued=3.0, token_usage=0.71, gen_throughput=3650.5,
                              accept_length=3.08)


def test_metrics_without_sglang_names_give_none() -> None:
    assert parse_metrics("vllm:num_requests_running 3\n") is None


BOUNDS = AutoBounds(minimum=1, maximum=512)


def test_cold_start_grows_when_the_queue_is_empty() -> None:
    limit = 16
    for _ in range(10):
        limit = next_limit(limit, ServerLoad(running=limit, queued=0), limit, BOUNDS)
    assert limit > 100


def test_long_queue_shrinks() -> None:
    assert next_limit(200, ServerLoad(running=64, queued=136), 200, BOUNDS) < 200


def test_small_nonempty_queue_holds() -> None:
    assert next_limit(70, ServerLoad(running=64, queued=4), 70, BOUNDS) == 70


def test_no_growth_when_we_do_not_fill_the_limit() -> None:
    assert next_limit(100, ServerLoad(running=10, queued=0), 10, BOUNDS) == 100


def test_full_kv_cache_does_not_grow() -> None:
    assert next_limit(64, ServerLoad(running=64, queued=0, token_usage=0.97), 64, BOUNDS) == 64


@given(st.integers(1, 512), st.floats(0, 1000), st.floats(0, 1000), st.integers(0, 600),
       st.floats(0, 1))
def test_limit_stays_in_bounds(current, running, queued, in_flight, usage) -> None:
    new = next_limit(current, ServerLoad(running=running, queued=queued, token_usage=usage),
                     in_flight, BOUNDS)
    assert BOUNDS.minimum <= new <= BOUNDS.maximum


@given(st.integers(1, 20))
def test_backoff_grows_and_is_capped(attempt) -> None:
    policy = RetryPolicy(max_attempts=5, base_s=1.0, cap_s=30.0)
    delay = policy.delay(attempt)
    ceiling = min(30.0, 2 ** (attempt - 1))
    assert ceiling / 2 <= delay <= ceiling
    assert policy.exhausted(attempt) == (attempt >= 5)
