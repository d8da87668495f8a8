"""apt-get install, for what tokenmill sets up itself as root on Debian: the
container engine, Ceph's S3 gateway, the report tests' browser.

Several installs may run at once (CI's test processes start them side by
side, on a machine that has none of them), and dpkg takes one at a time: a
second apt-get fails at once with "Unable to acquire the dpkg frontend
lock". So ours queue on a lock file of their own, and apt-get itself waits
for dpkg's lock (anyone else's install), both for at most LOCK_TIMEOUT_S.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from devstack import prerequisites

LOCK_TIMEOUT_S = 600.0
# one apt-get, its wait for dpkg's lock included (downloads: ~100 MB at most)
RUN_TIMEOUT_S = LOCK_TIMEOUT_S + 900.0
POLL_S = 0.5


class InstallError(Exception):
    """An install that cannot be done, in one line."""


def can_install() -> bool:
    """Root on a machine with apt-get: the only place tokenmill installs."""
    return os.geteuid() == 0 and shutil.which("apt-get") is not None


def _lock_path() -> Path:
    return Path(prerequisites.kafka_cache_dir()).parent / ".apt-install.lock"


def _last_line(stderr: str) -> str:
    return (stderr.strip().splitlines() or ["no output"])[-1]


def install(packages: Sequence[str], timeout_s: float = LOCK_TIMEOUT_S) -> None:
    """apt-get install `packages` (without recommends), after an apt-get
    update when the first try fails (a stale or empty package list)."""
    if not can_install():
        raise InstallError(f"apt-get install {' '.join(packages)}: tokenmill installs "
                           "packages itself only as root on Debian")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    wait = ("-o", f"DPkg::Lock::Timeout={int(timeout_s)}")
    command = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *wait, *packages]
    lock_path = _lock_path()
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as lock:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise InstallError(f"apt-get install {' '.join(packages)}: another "
                                       f"install held {lock_path} for {timeout_s:.0f} s") from None
                time.sleep(POLL_S)  # the poll of this wait for the lock
        try:
            if subprocess.run(command, env=env, capture_output=True,
                              timeout=RUN_TIMEOUT_S).returncode == 0:
                return
            subprocess.run(["apt-get", "update", "-q", *wait], env=env, capture_output=True,
                           check=False, timeout=RUN_TIMEOUT_S)
            result = subprocess.run(command, env=env, capture_output=True, text=True,
                                    timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            raise InstallError(f"apt-get install {' '.join(packages)}: {exc.cmd[1]} did not "
                               f"end within {RUN_TIMEOUT_S:.0f} s") from None
        if result.returncode != 0:
            raise InstallError(f"apt-get install {' '.join(packages)} failed: "
                               f"{_last_line(result.stderr)}")
