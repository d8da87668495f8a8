"""A real S3 server for the dev stack and the tests: Ceph's RADOS Gateway
(radosgw) on a one-node Ceph cluster, from Debian's packages.

Why Ceph: it is an object store people run in production (LGPL), Debian
ships it (bookworm: 16.2 "Pacific"), and its gateway honours conditional
writes the way the sink needs: `If-None-Match: *` on PutObject is decided
by RADOS's exclusive create, so of several writers racing for a key exactly
one wins and the others get 412. What it does not honour, the sink's
start-up check (sink/store_check.py) finds and works around or refuses:
Pacific compares `If-Match` with the ETag unquoted, and ignores conditions
on CompleteMultipartUpload.

The cluster: one monitor, one BlueStore OSD on a sparse file (objects last
across restarts of any of the three processes, unlike moto's), one gateway.
Replication 1, one placement group per pool, no cephx (it listens on
loopback only). Each daemon runs in the foreground in its own session, so
the stack can stop it and restart it with the same command on the same data.
The S3 user's keys are the dev stack's (devstack/s3_server.py).

Start-up on a 2-core machine: about 12 s (monitor 1 s, OSD 8 s, user and
pools 2 s, gateway 1 s); the packages (62 MB) install in about 20 s.
"""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import msgspec

from devstack import debian_packages, processes, s3_server
from tokenmill.log import get_logger

log = get_logger("devstack")

KIND = "ceph"
# What each program comes in (Debian bookworm); ceph-common and ceph-base
# come with them as dependencies.
PROGRAMS = {"ceph-mon": "ceph-mon", "ceph-osd": "ceph-osd", "radosgw": "radosgw",
            "radosgw-admin": "ceph-common", "ceph": "ceph-common", "monmaptool": "ceph-base",
            "ceph-authtool": "ceph-common"}
PACKAGES = ("ceph-mon", "ceph-osd", "radosgw")
COMMAND_TIMEOUT_S = 120.0
BLOCK_BYTES = 10 * 1024**3  # sparse: only what is written takes disk


class CephSetupError(RuntimeError):
    """Ceph's programs are missing, or the cluster did not come up."""


class Daemon(msgspec.Struct):
    """One process of the cluster (the same fields as the stack's services)."""

    name: str
    pid: int
    address: str
    log: str
    argv: list[str]
    ports: list[int]


class Cluster(msgspec.Struct):
    home: str
    config: str
    daemons: list[Daemon]  # monitor, OSD, gateway

    @property
    def gateway(self) -> Daemon:
        return self.daemons[-1]

    @property
    def endpoint(self) -> str:
        return self.gateway.address


def missing_packages() -> list[str]:
    """All of PACKAGES when any program is missing (they install together)."""
    return [] if all(shutil.which(program) for program in PROGRAMS) else list(PACKAGES)


def ensure_installed(on_progress: Callable[[str], None] | None = None) -> None:
    """apt-get install Ceph's packages when a program is missing (as root on
    Debian; elsewhere one line says what to install)."""
    if not missing_packages():
        return
    if not debian_packages.can_install():
        raise CephSetupError(
            f"the real S3 server needs Ceph's packages: apt-get install --no-install-recommends "
            f"{' '.join(PACKAGES)} (tokenmill installs them itself only as root on Debian)")
    if on_progress:
        on_progress(f"installing {', '.join(PACKAGES)} from Debian (once)")
    log.info("installing Ceph's packages from Debian (once)", packages=list(PACKAGES))
    try:
        debian_packages.install(PACKAGES)
    except debian_packages.InstallError as exc:
        raise CephSetupError(str(exc)) from None


def config_text(home: Path, host: str, mon_port: int, fsid: str) -> str:
    return f"""# Written by tokenmill (devstack/ceph_rgw.py): a one-node Ceph cluster for
# the dev stack and the tests, on loopback only.
[global]
fsid = {fsid}
mon_host = v2:{host}:{mon_port}
public_addr = {host}
ms_bind_ipv6 = false
ms_bind_msgr1 = false
auth_cluster_required = none
auth_service_required = none
auth_client_required = none
auth_allow_insecure_global_id_reclaim = true
ms_mon_client_mode = crc
ms_client_mode = crc
osd_pool_default_size = 1
osd_pool_default_min_size = 1
osd_pool_default_pg_num = 1
osd_pool_default_pgp_num = 1
osd_pool_default_pg_autoscale_mode = off
osd_crush_chooseleaf_type = 0
mon_allow_pool_size_one = true
mon_warn_on_pool_no_redundancy = false
mon_warn_on_insecure_global_id_reclaim_allowed = false
mon_osd_crush_smoke_test = false
mon_data_avail_warn = 1
mon_data_avail_crit = 0
mon_max_pg_per_osd = 1000
paxos_propose_interval = 0.05
osd_client_watch_timeout = 10
rgw_rados_pool_pg_num_min = 1
rgw_user_max_buckets = 100000
client_mount_timeout = 30
rados_mon_op_timeout = 30
rados_osd_op_timeout = 60
admin_socket =
pid_file =
log_file = {home}/log/$name.log
log_to_stderr = false

[mon.a]
mon_data = {home}/mon

[osd.0]
osd_data = {home}/osd
osd_objectstore = bluestore
bluestore_block_path = {home}/osd.block
bluestore_block_create = true
bluestore_block_size = {BLOCK_BYTES}
bluestore_fsck_on_mount = false
bluestore_cache_autotune = false
bluestore_cache_size = 134217728
"""


def _run(argv: list[str], what: str) -> str:
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
                                stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise CephSetupError(f"{what}: no answer within {COMMAND_TIMEOUT_S:.0f}s") from None
    if result.returncode != 0:
        lines = (result.stderr.strip() or result.stdout.strip()).splitlines() or ["no output"]
        raise CephSetupError(f"{what} failed: {lines[-1]}")
    return result.stdout


def gateway_command(config: str, name: str, host: str, port: int, home: str) -> list[str]:
    """A gateway's command line: any number of them may serve one cluster."""
    return ["radosgw", "-f", "-c", config, "-n", f"client.rgw.{name}",
            f"--rgw_frontends=beast endpoint={host}:{port}", f"--rgw_data={home}/rgw.{name}"]


def start(home: Path, host: str, port: int,
          on_progress: Callable[[str], None] | None = None,
          timeout_s: float = 120.0) -> Cluster:
    """Install when missing, create the cluster in `home` and start it; the
    gateway answers S3 on `host:port` with the dev stack's keys."""
    ensure_installed(on_progress)
    progress = on_progress or (lambda _: None)
    home.mkdir(parents=True, exist_ok=True)
    (home / "log").mkdir(exist_ok=True)
    mon_port = processes.free_port(host)
    config = home / "ceph.conf"
    fsid = str(uuid.uuid4())
    config.write_text(config_text(home, host, mon_port, fsid))
    conf = ["-c", str(config)]
    progress("starting Ceph: monitor")
    keyring = home / "mon.keyring"
    _run(["ceph-authtool", "--create-keyring", str(keyring), "--gen-key", "-n", "mon.",
          "--cap", "mon", "allow *"], "ceph-authtool")
    monmap = home / "monmap"
    _run(["monmaptool", "--create", "--addv", "a", f"[v2:{host}:{mon_port}]", "--fsid", fsid,
          str(monmap)], "monmaptool")
    _run(["ceph-mon", *conf, "--mkfs", "-i", "a", "--monmap", str(monmap),
          "--keyring", str(keyring)], "ceph-mon --mkfs")
    daemons = [_spawn("ceph-mon", ["ceph-mon", "-f", *conf, "-i", "a"], home,
                      f"{host}:{mon_port}", [mon_port])]
    cluster = Cluster(home=str(home), config=str(config), daemons=daemons)
    try:
        progress("starting Ceph: OSD (BlueStore on a sparse file)")
        (home / "osd").mkdir(exist_ok=True)
        osd_uuid = str(uuid.uuid4())
        osd_id = _run(["ceph", *conf, "--connect-timeout", "60", "osd", "new", osd_uuid],
                      "ceph osd new").strip()
        _run(["ceph-osd", *conf, "-i", osd_id, "--mkfs", "--osd-uuid", osd_uuid],
             "ceph-osd --mkfs")
        daemons.append(_spawn("ceph-osd", ["ceph-osd", "-f", *conf, "-i", osd_id], home,
                              f"osd.{osd_id}", []))
        progress("starting Ceph: S3 user and pools")
        # The output holds the secret key: it is never logged.
        _run(["radosgw-admin", *conf, "user", "create", "--uid", "tokenmill",
              "--display-name", "tokenmill dev stack", "--access-key", s3_server.DEV_ACCESS_KEY,
              "--secret", s3_server.DEV_SECRET_KEY], "radosgw-admin user create")
        progress("starting Ceph: the S3 gateway")
        daemons.append(_spawn("s3", gateway_command(str(config), "gw", host, port, str(home)),
                              home, f"http://{host}:{port}", [port]))
        wait_for_gateway(daemons[-1], timeout_s)
    except BaseException:
        stop(cluster)
        raise
    return cluster


def _spawn(name: str, argv: list[str], home: Path, address: str, ports: list[int]) -> Daemon:
    log_path = home / "log" / f"{name}.out"
    return Daemon(name=name, pid=processes.spawn(argv, log_path), address=address,
                  log=str(log_path), argv=argv, ports=ports)


def restart(daemon: Daemon) -> Daemon:
    """The same command on the same data."""
    return msgspec.structs.replace(daemon, pid=processes.spawn(daemon.argv, Path(daemon.log)))


def wait_for_gateway(gateway: Daemon, timeout_s: float) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not processes.alive(gateway.pid):
            raise CephSetupError(f"the Ceph S3 gateway exited during start-up; see {gateway.log} "
                                 f"and {Path(gateway.log).parent}")
        try:
            with urllib.request.urlopen(gateway.address + "/", timeout=1.0):
                return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            time.sleep(0.2)
    raise CephSetupError(f"the Ceph S3 gateway did not answer at {gateway.address} within "
                         f"{timeout_s:.0f}s; see {gateway.log}")


def stop(cluster: Cluster) -> None:
    processes.stop_all([d.pid for d in reversed(cluster.daemons)
                        if processes.running_as(d.pid, d.argv)])
