"""Has the run finished a stage? The `--until-done` check of workers and
sinks: the run's progress (every member's committed counters,
tokenmill/progress.py) read every few seconds, until a predicate on it
holds (`RunProgress.generation_done` for workers, `sink_done` for sinks).

A read that fails (broker restarting, leaders moving) is logged and tried
again at the next look: it never stops the service.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tokenmill import progress
from tokenmill.log import get_logger
from tokenmill.progress import RunProgress
from tokenmill.settings import Settings

log = get_logger("tokenmill.run_done")


def look(settings: Settings, run_id: str) -> RunProgress | None:
    """The run's progress now, or None (logged) when it cannot be read just
    now. Blocking: call it off an event loop."""
    try:
        return progress.try_read_run_progress(settings, run_id)
    except progress.ProgressUnavailable as exc:
        log.warning("run progress unavailable; checking again later", error=str(exc))
        return None


async def wait_until(settings: Settings, run_id: str, done: Callable[[RunProgress], bool], *,
                     interval_s: float, stopping: Callable[[], bool]) -> RunProgress | None:
    """Look every `interval_s` (in a thread) until `done` holds for what is
    read, and return that; None once `stopping()` says the service stops
    for another reason."""
    while not stopping():
        await asyncio.sleep(interval_s)
        state = await asyncio.to_thread(look, settings, run_id)
        if state is not None and done(state):
            return state
    return None
