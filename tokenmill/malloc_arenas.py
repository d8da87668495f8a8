"""At most two glibc malloc arenas per process.

glibc gives each thread that allocates under contention an arena of its own
(up to 8 per core), and memory freed in an arena is rarely given back while
any allocation in it lives. A worker's threads (librdkafka's, and the ones
asyncio.to_thread borrows for broker lookups) keep allocating and freeing,
and on the seed-sized run each worker's resident size rose 73-157 MiB an
hour. With two arenas a paced worker stayed flat in every run measured
(70-99 MiB, at most 2 MiB in seven minutes), where glibc's default went
74 -> 91 MiB in one of two paired runs (docs/benchmarks.md, the seed run's
findings; bench/bench_worker_memory.py). `MALLOC_ARENA_MAX=2` does the same
from the environment; setting it here holds for every way a process is
started (systemd, containers, tests)."""

from __future__ import annotations

import ctypes
import os

M_ARENA_MAX = -8  # glibc's <malloc.h>
ARENAS = 2


def limit_arenas(arenas: int = ARENAS) -> bool:
    """Caps the arenas of this process (call it before threads start);
    False where the C library is not glibc or the environment already set
    MALLOC_ARENA_MAX (the operator's choice wins)."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    try:
        # the symbols already loaded into this process (libc's among them):
        # no `ldconfig` run, as ctypes.util.find_library would do at each start
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to cap
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, arenas))
