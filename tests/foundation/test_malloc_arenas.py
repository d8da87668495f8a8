"""The glibc arena cap (tokenmill/malloc_arenas.py): applied in a fresh
process, not applied over an operator's MALLOC_ARENA_MAX."""

from __future__ import annotations

import subprocess
import sys


def arenas_after_threads(*, env: dict[str, str] | None = None) -> tuple[bool, int]:
    """(whether the cap was applied, arenas glibc's malloc_info lists) in a
    fresh interpreter whose 16 threads allocated at once."""
    code = """
import ctypes, threading, tempfile
from tokenmill.malloc_arenas import limit_arenas
applied = limit_arenas()
barrier = threading.Barrier(16)
def churn():
    barrier.wait()
    kept = [bytearray(256) for _ in range(20000)]
threads = [threading.Thread(target=churn) for _ in range(16)]
[t.start() for t in threads]
[t.join() for t in threads]
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
with tempfile.NamedTemporaryFile() as out:
    f = libc.fopen(out.name.encode(), b"w")
    libc.malloc_info(0, ctypes.c_void_p(f))
    libc.fclose(ctypes.c_void_p(f))
    print(applied, open(out.name).read().count("<heap nr="))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=True, env=env)
    applied, arenas = result.stdout.split()
    return applied == "True", int(arenas)


def test_the_cap_holds_the_arenas_at_two_however_many_threads_allocate() -> None:
    applied, arenas = arenas_after_threads(env={"PATH": "/usr/bin:/bin"})
    assert applied
    assert arenas <= 2


def test_without_the_cap_the_same_threads_get_more_arenas() -> None:
    """The control: the same threads, the cap not applied (the environment
    sets a larger one, which limit_arenas leaves alone)."""
    applied, arenas = arenas_after_threads(env={"PATH": "/usr/bin:/bin",
                                                "MALLOC_ARENA_MAX": "8"})
    assert not applied
    assert arenas > 2
