"""Fixtures: simulators on free ports (in a background thread, real HTTP)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sglang_sim import SimulatorConfig
from sglang_sim.runner import SimulatorThread


@pytest.fixture
def simulator() -> Iterator[Callable[..., str]]:
    """Factory: simulator(**config fields) -> base URL; all stopped at teardown."""
    started: list[SimulatorThread] = []

    def start(**fields: Any) -> str:
        sim = SimulatorThread(SimulatorConfig(**fields))
        started.append(sim)
        return sim.start()

    yield start
    for sim in started:
        sim.stop()


@pytest.fixture(scope="module")
def fast_url() -> Iterator[str]:
    """A shared zero-delay simulator with the qwen3 reasoning and qwen25 tool parsers."""
    sim = SimulatorThread(SimulatorConfig(zero_delay=True, tool_call_parser="qwen25",
                                          enable_cache_report=True,
                                          speculative_accept_length=2.5))
    sim.start()
    yield sim.base_url
    sim.stop()
