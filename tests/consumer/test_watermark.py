import pytest
from hypothesis import given
from hypothesis import strategies as st

from consumer.watermark import OffsetOrderError, Watermark


@st.composite
def offsets_and_order(draw):
    gaps = draw(st.lists(st.integers(1, 3), min_size=1, max_size=60))
    offsets, current = [], draw(st.integers(0, 1000))
    for gap in gaps:
        offsets.append(current)
        current += gap  # gaps > 1 model transaction markers taking offset slots
    order = draw(st.permutations(offsets))
    cut = draw(st.integers(0, len(order)))
    return offsets, list(order[:cut])


@given(offsets_and_order())
def test_only_the_contiguous_finished_prefix_is_ready(case) -> None:
    offsets, finished = case
    mark: Watermark[int] = Watermark()
    for offset in offsets:
        mark.track(offset)
    for offset in finished:
        mark.finish(offset, offset * 10)
    results, commit = mark.peek_ready()
    done = set(finished)
    prefix = []
    for offset in offsets:
        if offset not in done:
            break
        prefix.append(offset)
    assert results == [o * 10 for o in prefix]
    assert commit == (prefix[-1] + 1 if prefix else None)
    assert mark.in_flight == len(offsets) - len(finished)
    assert mark.waiting == len(finished) - len(prefix)


@given(offsets_and_order())
def test_take_then_continue(case) -> None:
    offsets, finished = case
    mark: Watermark[int] = Watermark()
    for offset in offsets:
        mark.track(offset)
    for offset in finished:
        mark.finish(offset, offset)
    results, commit = mark.peek_ready()
    mark.take(len(results))
    assert mark.peek_ready() == ([], None)
    # the rest still completes, in order, after the first commit
    for offset in offsets:
        if offset not in finished:
            mark.finish(offset, offset)
    rest, last = mark.peek_ready()
    assert results + rest == offsets
    assert last == (offsets[-1] + 1 if rest else None)


def test_peek_limit_and_commit_offset_skips_marker_slots() -> None:
    mark: Watermark[str] = Watermark()
    for offset in (10, 12, 13):  # 11 was a transaction marker
        mark.track(offset)
    for offset in (13, 10, 12):
        mark.finish(offset, f"r{offset}")
    assert mark.peek_ready(limit=2) == (["r10", "r12"], 13)
    assert mark.peek_ready() == (["r10", "r12", "r13"], 14)


def test_offsets_must_go_up() -> None:
    mark: Watermark[str] = Watermark()
    mark.track(5)
    with pytest.raises(OffsetOrderError):
        mark.track(5)
    mark.finish(5, "a")
    mark.take(1)
    with pytest.raises(OffsetOrderError):
        mark.track(4)


def test_double_finish_is_refused() -> None:
    mark: Watermark[str] = Watermark()
    mark.track(1)
    mark.finish(1, "a")
    with pytest.raises(ValueError):
        mark.finish(1, "b")
