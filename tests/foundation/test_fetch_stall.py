"""The fetch-stall rule (tokenmill/kafka/fetch_stall.py): a partition is
judged only once silent for the limit over enough polls, and stalled only
when the broker's committed end is past where the consumer would read."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tokenmill.kafka.fetch_stall import LOOK_EVERY_S, Silence, describe, look_interval, stalled


def test_silent_only_after_the_limit_and_enough_polls() -> None:
    silence = Silence(limit_s=60, min_polls=3)
    silence.owned([0, 1], now=0)
    for _ in range(3):
        silence.polled()
    assert silence.silent(59.9) == {}
    assert silence.silent(60) == {0: None, 1: None}
    quiet = Silence(limit_s=60, min_polls=3)
    quiet.owned([0], now=0)
    quiet.polled()  # a loop blocked elsewhere polled once in a minute: no verdict
    assert quiet.silent(600) == {}


def test_what_was_heard_sets_where_it_would_read_next() -> None:
    silence = Silence(limit_s=10, min_polls=0)
    silence.owned([0, 1, 2, 3], now=0)
    silence.record(0, 41, now=0)
    silence.end(1, 7, now=0)
    silence.restarted(2, 5, now=0)
    silence.dropped([3])
    silence.record(3, 99, now=0)  # not owned any more: ignored
    assert silence.silent(10) == {0: 42, 1: 7, 2: 5}
    silence.record(0, 42, now=5)
    assert silence.silent(10) == {1: 7, 2: 5}
    assert silence.silent_for(0, 10) == 5


def test_stalled_only_with_committed_records_past_the_read_position() -> None:
    silent = {0: 42, 1: 7, 2: None, 3: None, 4: 9}
    ends = {0: 50, 1: 7, 2: 30, 3: 30}  # 4: the broker did not say
    committed = {2: 12, 3: 30}
    assert stalled(silent, ends, committed) == {0: (42, 50), 2: (12, 30)}
    # an end held back by a transaction left open is where the consumer is
    assert stalled({0: 42}, {0: 42}, {}) == {}
    # nothing committed by the group (-1001): not judged
    assert stalled({0: None}, {0: 10}, {0: -1001}) == {}


def test_a_verdict_stands_only_when_the_next_look_finds_the_same() -> None:
    silence = Silence()
    assert silence.confirm({0: (42, 50), 1: (7, 9)}) == {}  # first look: suspected only
    # records committed a moment before the first look were fetched since:
    # 1 moved on (heard, so read further) and is judged afresh
    assert silence.confirm({0: (42, 51), 1: (9, 12)}) == {0: (42, 51)}
    assert silence.confirm({1: (9, 12)}) == {1: (9, 12)}
    assert silence.confirm({}) == {}
    assert silence.confirm({1: (9, 12)}) == {}  # a look in between found nothing


def test_the_line_names_the_topic_partitions_and_what_waits() -> None:
    line = describe("tokenmill.r.completions", {2: (12, 30), 0: (42, 50)}, 61.4)
    assert line.startswith("the Kafka consumer stopped fetching tokenmill.r.completions: "
                           "nothing came for 61s")
    assert "0 (8 records from offset 42), 2 (18 records from offset 12)" in line
    assert line.endswith("exiting so that the supervisor restarts it from committed state")


def test_looks_come_every_half_limit_and_at_most_every_ten_seconds() -> None:
    assert look_interval(5.0) == 2.5
    assert look_interval(60.0) == LOOK_EVERY_S == 10.0
    assert look_interval(1.0) == 0.5  # the flag's floor


EVENTS = st.lists(st.tuples(st.sampled_from(["record", "end", "restart", "poll", "drop", "own"]),
                            st.integers(0, 3), st.integers(0, 100), st.floats(0, 30)),
                  max_size=60)


@given(EVENTS, st.floats(0, 30))
def test_a_partition_heard_within_the_limit_is_never_silent(events, after) -> None:
    silence = Silence(limit_s=20, min_polls=2)
    now = 0.0
    last_heard: dict[int, float] = {}
    for kind, partition, offset, step in events:
        now += step
        if kind == "own":
            silence.owned([partition], now)
            last_heard[partition] = now
        elif kind == "drop":
            silence.dropped([partition])
            last_heard.pop(partition, None)
        elif kind == "poll":
            silence.polled()
        elif partition in last_heard:
            {"record": silence.record, "end": silence.end,
             "restart": silence.restarted}[kind](partition, offset, now)
            last_heard[partition] = now
    now += after
    silent = silence.silent(now)
    assert set(silent) <= set(last_heard)
    assert all(now - last_heard[p] >= 20 for p in silent)
    verdict = stalled(silent, {p: 1000 for p in silent}, {p: 0 for p in silent})
    assert set(verdict) == set(silent)
