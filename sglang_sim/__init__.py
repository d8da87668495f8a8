"""An SGLang-compatible test server (`tokenmill sim-sglang`).

Public API:

* `SimulatorConfig` - every knob, with defaults (config.py)
* `create_app(config)` - the aiohttp application (server.py)
* `running_simulator(config, port=0)` - base URL of a simulator in a thread
* `SimulatorThread`, `SimulatorProcess`, `running_simulator_process` - handles
  for in-process and subprocess simulators (runner.py)
"""

from sglang_sim.config import SimulatorConfig

__all__ = [
    "SimulatorConfig",
    "SimulatorProcess",
    "SimulatorThread",
    "create_app",
    "running_simulator",
    "running_simulator_process",
]


def __getattr__(name: str) -> object:
    # lazy: importing the config must not pull in aiohttp
    if name == "create_app":
        from sglang_sim.server import create_app

        return create_app
    if name in ("running_simulator", "running_simulator_process", "SimulatorThread",
                "SimulatorProcess"):
        from sglang_sim import runner

        return getattr(runner, name)
    raise AttributeError(name)
