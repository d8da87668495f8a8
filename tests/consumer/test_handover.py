"""Draining a donated slot before it closes (consumer/handover.py)."""

from __future__ import annotations

from consumer.handover import Handovers, drain_limit_s


def test_drain_limit_is_short_and_never_above_the_latency() -> None:
    assert drain_limit_s(20.0) == 3.0  # a slow GPU's long answers are not worth the wait
    assert drain_limit_s(0.5) == 0.5
    assert drain_limit_s(0.0) == 0.0  # no latency known yet: hand over at once


def test_a_slot_closes_when_drained_or_when_its_limit_passes() -> None:
    handovers = Handovers()
    in_flight = {"w#1": 2, "w#2": 1}
    handovers.start("w#1", now=0.0, limit_s=3.0)
    handovers.start("w#2", now=0.0, limit_s=3.0)
    handovers.start("w#1", now=2.0, limit_s=3.0)  # started already: keeps its deadline
    assert "w#1" in handovers and bool(handovers)
    assert handovers.due(1.0, in_flight.__getitem__) == []
    in_flight["w#2"] = 0
    assert handovers.due(1.5, in_flight.__getitem__) == [("w#2", True)]
    assert handovers.due(3.0, in_flight.__getitem__) == [("w#1", False)]
    assert not handovers
