"""The container engine on a machine without Docker: Debian's podman, set up
by tokenmill itself (packages, /etc/containers/containers.conf, and a
Docker-compatible API socket for testcontainers).

Every step is idempotent: packages are installed only when a tool is
missing, the config is written only when missing or differing, and the
socket is started only when nothing answers on it. Podman here needs runc
(crun: "cgroups in hybrid mode not supported"), the cgroupfs manager and no
default ulimits ("setrlimit ... Operation not permitted").
"""

from __future__ import annotations

import http.client
import os
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from devstack import debian_packages, prerequisites, processes
from tokenmill.log import get_logger

log = get_logger("devstack")

# Debian package -> a program it installs (present means installed).
PACKAGES = {
    "podman": "podman",
    "runc": "runc",
    "debootstrap": "debootstrap",
    "podman-compose": "podman-compose",
    "netavark": "/usr/lib/podman/netavark",
    "aardvark-dns": "/usr/lib/podman/aardvark-dns",
    "iptables": "iptables",
    "slirp4netns": "slirp4netns",
    "uidmap": "newuidmap",
}
CONTAINERS_CONF = Path("/etc/containers/containers.conf")
CONTAINERS_CONF_TEXT = """\
# Written by tokenmill (devstack/container_engine.py): podman on
# this machine needs runc, cgroupfs and no default ulimits.
[containers]
default_ulimits = []

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"

[network]
network_backend = "netavark"
"""
SOCKET_TIMEOUT_S = 60.0


class EngineError(RuntimeError):
    """The container engine is missing and cannot be set up here."""


def state_dir() -> Path:
    """Where the socket and its pid file live (beside the Kafka jar cache)."""
    return Path(prerequisites.kafka_cache_dir()).parent / "podman"


def socket_path() -> Path:
    return Path(os.environ.get("TOKENMILL_PODMAN_SOCKET") or state_dir() / "podman.sock")


def program_present(program: str) -> bool:
    """An absolute path exists, or a bare name is on PATH."""
    return os.path.exists(program) if program.startswith("/") else shutil.which(program) is not None


def missing_packages(programs: dict[str, str] = PACKAGES) -> list[str]:
    """The Debian packages whose program is not on this machine."""
    return [package for package, program in programs.items() if not program_present(program)]


def config_differs(path: Path, wanted: str) -> bool:
    try:
        return path.read_text() != wanted
    except FileNotFoundError:
        return True


def ensure_packages() -> None:
    """apt-get install what is missing (once: later calls find the programs)."""
    missing = missing_packages()
    if not missing:
        return
    if not debian_packages.can_install():
        raise EngineError(f"missing: {', '.join(missing)} (install them: apt-get install "
                          f"{' '.join(missing)}; tokenmill installs them itself only as root "
                          "on Debian)")
    log.info("installing the container engine from Debian", packages=missing)
    try:
        debian_packages.install(missing)
    except debian_packages.InstallError as exc:
        raise EngineError(str(exc)) from None


def ensure_config(path: Path = CONTAINERS_CONF, wanted: str = CONTAINERS_CONF_TEXT) -> bool:
    """Write podman's config when missing or differing; True when written."""
    if not config_differs(path, wanted):
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(wanted)
    log.info("wrote podman's config (runc, cgroupfs, no default ulimits)", path=str(path))
    return True


def ensure_engine() -> None:
    """Packages and config: enough for the podman CLI (builds, compose)."""
    ensure_packages()
    ensure_config()


def api_answers(path: Path, timeout_s: float = 3.0) -> bool:
    """The Docker-compatible API answers `/_ping` on the unix socket."""
    connection = _UnixHTTPConnection(str(path), timeout_s)
    try:
        connection.request("GET", "/_ping")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


@dataclass(frozen=True)
class ApiService:
    """podman's Docker-compatible API on a unix socket; `pid` is set when
    this process started it (and so must stop it)."""

    socket: Path
    pid: int | None

    @property
    def docker_host(self) -> str:
        return f"unix://{self.socket}"

    def env(self) -> dict[str, str]:
        """What testcontainers needs to use it: the socket, no Ryuk (podman
        has no reaper image here), and the host's view of mapped ports."""
        return {"DOCKER_HOST": self.docker_host, "TESTCONTAINERS_RYUK_DISABLED": "true",
                "TESTCONTAINERS_CONNECTION_MODE": "docker_host"}

    def stop(self) -> None:
        if self.pid is not None:
            processes.stop(self.pid)


def start_api(path: Path | None = None, timeout_s: float = SOCKET_TIMEOUT_S) -> ApiService:
    """Reuse an API that answers on the socket, else start one."""
    path = path or socket_path()
    if api_answers(path):
        return ApiService(path, None)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    pid = processes.spawn(["podman", "system", "service", "--time=0", f"unix://{path}"],
                          path.parent / "podman-service.log")
    deadline = time.monotonic() + timeout_s
    while not api_answers(path):
        if time.monotonic() > deadline or not processes.alive(pid):
            processes.stop(pid)
            raise EngineError(f"podman's API did not answer on {path} within {timeout_s:.0f}s "
                              f"(log: {path.parent / 'podman-service.log'})")
        time.sleep(0.2)
    log.info("podman's Docker-compatible API is up", socket=str(path), pid=pid)
    return ApiService(path, pid)


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock
