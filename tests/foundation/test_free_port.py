"""`devstack.processes.free_port`: the ports tests and private stacks listen
on come from outside the kernel's ephemeral range, so that a listener
restarted on its port (a broker a test bounces) never finds it taken by a
client's outgoing connection."""

from __future__ import annotations

import socket

from hypothesis import given
from hypothesis import strategies as st

from devstack import processes


def test_a_free_port_is_outside_the_ephemeral_range_and_can_be_bound() -> None:
    low, high = processes.ephemeral_range()
    for _ in range(20):
        port = processes.free_port()
        assert not low <= port <= high
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))


def test_one_process_is_never_handed_the_same_port_twice() -> None:
    # a stack picks all its ports before any binds; at random among ~22,800
    # ports, 1,000 picks would agree on some ~20 times (a CI run's stack got
    # one port for two brokers' listeners)
    ports = [processes.free_port() for _ in range(1000)]
    assert len(set(ports)) == len(ports)


def test_linux_default_range_leaves_ports_below_it() -> None:
    assert processes.listener_ports((32768, 60999)) == range(10000, 32768)


@given(st.integers(1024, 65535), st.integers(0, 40000))
def test_listener_ports_never_overlap_the_ephemeral_range(low: int, width: int) -> None:
    high = min(low + width, 65535)
    ports = processes.listener_ports((low, high))
    assert not set(ports) & set(range(low, high + 1))
    assert all(1024 < port < 65536 for port in ports)
