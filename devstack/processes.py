"""Detached service processes: start in their own session, find by pid file,
stop the whole process group, leave nothing behind."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path


class PortInUse(RuntimeError):
    """A port the stack needs is taken by another process."""


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def require_free(host: str, port: int, what: str, flag: str) -> None:
    if not port_free(host, port):
        raise PortInUse(
            f"port {port} on {host} (needed for {what}) is already in use; "
            f"stop whatever holds it or choose another with {flag}"
        )


EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LISTENER_PORTS_FROM = 10000  # above the ports Ceph's daemons pick (6800-7300)


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel hands out to outgoing connections and bind(0)."""
    try:
        low, high = (int(part) for part in EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default
    return low, high


def listener_ports(ephemeral: tuple[int, int]) -> range:
    """Where `free_port` picks: the larger span outside the ephemeral range."""
    low, high = ephemeral
    below, above = range(LISTENER_PORTS_FROM, low), range(high + 1, 65536)
    return below if len(below) >= len(above) else above


# Ports this process handed out: a stack's listeners are all picked before
# any binds, so two picks that agree would both look free (a CI run's
# kafka-2 and kafka-3 were given the same port, and kafka-2 failed to bind).
_handed_out: set[int] = set()
_handing_out = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now, outside the ephemeral range, and never one this
    process handed out before: a listener restarted on it later (a broker a
    test stops and starts) cannot find it taken by some client's outgoing
    connection, as it could a port bind(0) handed out (a CI run's broker
    restart failed on "Address already in use" that way)."""
    with _handing_out:
        port = _unused_port(host)
        _handed_out.add(port)
        return port


def _unused_port(host: str) -> int:
    ports = listener_ports(ephemeral_range())
    if ports:
        chooser = random.SystemRandom()
        for _ in range(200):
            port = chooser.choice(ports)
            if port not in _handed_out and port_free(host, port):
                return port
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port not in _handed_out:
            return port
    raise OSError(f"no free port on {host} that this process has not handed out already")


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def spawn(args: Sequence[str], log_path: Path, env: dict[str, str] | None = None,
          cwd: Path | None = None) -> int:
    """Start a detached process (own session, so its group can be killed)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log_file:
        process = subprocess.Popen(
            list(args),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
            cwd=cwd,
        )
    return process.pid


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours counts as gone.
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
        return waited == 0
    except ChildProcessError:
        return _not_zombie(pid)


def running_as(pid: int, argv: Sequence[str]) -> bool:
    """The process is alive and runs `argv` (not a stranger that reused a
    dead service's pid)."""
    deadline = time.monotonic() + 2.0
    while alive(pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False
        # Empty while the kernel is still setting up a process that has just
        # exec'd (Popen has returned already): look again.
        if cmdline or time.monotonic() > deadline:
            return cmdline.split(b"\0")[:-1] == [os.fsencode(arg) for arg in argv]
        time.sleep(0.02)
    return False


def _not_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to a process group; False when it is gone already."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def wait_gone(pid: int, timeout_s: float) -> bool:
    """Wait until the process and its group have exited; False on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive(pid) and not group_alive(pid):
            return True
        time.sleep(0.1)
    return False


def stop(pid: int, grace_s: float = 15.0) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left."""
    stop_all([pid], grace_s)


def stop_all(pids: Sequence[int], grace_s: float = 15.0) -> None:
    """Stop several process groups at once (a cluster's nodes shut down
    together instead of waiting, one by one, for a quorum that is leaving)."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        pending = [pid for pid in pids if signal_group(pid, sig)]
        deadline = time.monotonic() + wait
        pids = [pid for pid in pending
                if not wait_gone(pid, max(0.0, deadline - time.monotonic()))]
        if not pids:
            return


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return any(_not_zombie(pid) for pid in _group_members(pgid))


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members
