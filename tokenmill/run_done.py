"""Has the run finished a stage? The `--until-done` check of workers and
sinks: the run's progress (every member's committed counters,
tokenmill/progress.py) read every few seconds, each look going on from
the last (progress.ProgressTail), until a predicate on it holds
(`RunProgress.generation_done` for workers, `sink_done` for sinks).

A read that fails (broker restarting, leaders moving) is logged and tried
again at the next look: it never stops the service.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from tokenmill import progress
from tokenmill.log import get_logger
from tokenmill.progress import RunProgress
from tokenmill.settings import Settings

log = get_logger("tokenmill.run_done")


def look(tail: progress.ProgressTail) -> RunProgress | None:
    """The run's progress now, or None (logged) when it cannot be read just
    now. Blocking: call it off an event loop."""
    try:
        return tail.glance()
    except progress.ProgressUnavailable as exc:
        log.warning("run progress unavailable; checking again later", error=str(exc))
        return None


async def wait_until(settings: Settings, run_id: str, done: Callable[[RunProgress], bool], *,
                     interval_s: float, stopping: Callable[[], bool]) -> RunProgress | None:
    """Look every `interval_s` (in a thread) until `done` holds for what is
    read, and return that; None once `stopping()` says the service stops
    for another reason."""
    tail = progress.ProgressTail(settings, run_id)
    # One thread for the tail's looks and its close: cancelled mid-look, the
    # close waits for that look instead of closing its consumer under it.
    thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="run-done")
    loop = asyncio.get_running_loop()
    try:
        while not stopping():
            await asyncio.sleep(interval_s)
            state = await loop.run_in_executor(thread, look, tail)
            if state is not None and done(state):
                return state
        return None
    finally:
        thread.submit(tail.close)
        thread.shutdown(wait=False)
