"""The waste windows' timing rules (tests/consumer/waste.py), on made-up
timelines: what the tests that count waste from outside rely on."""

from __future__ import annotations

from tests.consumer.waste import Move, Waste


def _waste(requested: dict[str, list[float]], committed: dict[str, float],
           assigned: list[Move]) -> Waste:
    return Waste(wasted=0, redone=set(), windows=[], requested=requested,
                 committed=committed, partition=dict.fromkeys(requested, 3), assigned=assigned)


def test_a_request_stamped_after_its_senders_revoke_is_in_the_revokes_window() -> None:
    # a CI run of 2026-12-06: sent before the revoke at 51.021, stamped at 51.039
    found = _waste({"x": [51.039, 52.663]}, {"x": 60.0},
                   [("steady", 3, 50.940), ("victim", 3, 51.154)])
    assert found.windows_of([("steady", 3, 51.021)]) == [{"x"}]
    # what the new owner asked for after it was given the partition is not
    found = _waste({"y": [51.2]}, {"y": 60.0}, [("steady", 3, 50.940), ("victim", 3, 51.154)])
    assert found.windows_of([("steady", 3, 51.021)]) == [set()]


def test_a_zombies_window_ends_at_its_loss_when_the_partition_was_given_away_before() -> None:
    # w1 owned partition 3 from 10.0, froze; w0 was given it at 20.0 and asks
    # for y at 25.0; w1 logs the loss on waking at 30.0; w1 gets it back at 40.0
    assigned: list[Move] = [("w1", 3, 10.0), ("w0", 3, 20.0), ("w1", 3, 40.0)]
    found = _waste({"x": [12.0], "y": [25.0], "z": [31.0]},
                   {"x": 50.0, "y": 50.0, "z": 50.0}, assigned)
    assert found.sent_by(("w1", 3, 30.0)) == 30.0
    # y, w0's, was in flight on the partition at 30.0; z, asked for by w0
    # after the loss, is not the zombie's
    assert found.windows_of([("w1", 3, 30.0)]) == [{"x", "y"}]


def test_a_window_holds_nothing_committed_before_the_move() -> None:
    found = _waste({"x": [1.0], "y": [2.0]}, {"x": 4.0, "y": 6.0}, [("a", 3, 0.0)])
    assert found.windows_of([("a", 3, 5.0)]) == [{"y"}]
    assert found.sent_by(("a", 3, 5.0)) == float("inf")  # never given again
