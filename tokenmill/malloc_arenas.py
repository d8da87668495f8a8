"""At most two glibc malloc arenas per process.

glibc gives each thread that allocates under contention an arena of its own
(up to 8 per core), and memory freed in an arena is rarely given back while
any allocation in it lives. A worker's threads (librdkafka's, and the ones
asyncio.to_thread borrows for broker lookups) keep allocating and freeing,
so its resident size crept up for as long as it ran: 74 MiB to 91 MiB in
seven minutes of a paced run (about 85 MiB an hour, and on the seed-sized
run 73-157 MiB an hour per worker), where the same run with two arenas
stayed at 71-73 MiB (bench/results/seed_run.json; docs/benchmarks.md).
`MALLOC_ARENA_MAX=2` does the same from the environment; setting it here
holds for every way a process is started (systemd, containers, tests)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_ARENA_MAX = -8  # glibc's <malloc.h>
ARENAS = 2


def limit_arenas(arenas: int = ARENAS) -> bool:
    """Caps the arenas of this process (call it before threads start);
    False where the C library is not glibc or the environment already set
    MALLOC_ARENA_MAX (the operator's choice wins)."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to cap
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, arenas))
