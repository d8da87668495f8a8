"""A class-data-sharing archive of the broker's classes (JDK AppCDS), made
once per Kafka version and JDK, beside the cached jars.

Why: a broker spends about 2.2 CPU seconds reaching "Kafka Server started"
on this 2-core machine, most of it loading and verifying classes; with the
archive mapped it spends about 1.3, and a private stack's whole cycle
(format, start, restart, stop) drops from about 7.0 to 4.9 (measured with
the quick JVM). The test suite starts some forty brokers and storage tools,
on a machine whose CPU is its bottleneck; `dev up` and the demo start
sooner too.

How: one throwaway single-node broker started with
`-XX:ArchiveClassesAtExit`, stopped cleanly once it has started (the JVM
writes the archive as it exits), and the archive checked with
`-Xshare:on` before it is renamed into place: a truncated archive crashes
the JVM (SIGBUS), so nothing but a checked one is ever at the final path.
A JDK whose archive cannot be made leaves a `.failed` file saying why, and
brokers start without one; delete it to try again.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from devstack import kafka_broker, processes
from tokenmill.kafka import kraft
from tokenmill.log import get_logger

log = get_logger("devstack")

TRAIN_TIMEOUT_S = 120.0


class ArchiveError(RuntimeError):
    """The archive could not be made (the reason is its message)."""


def ensure(lib: Path, on_progress: Callable[[str], None] | None = None) -> Path | None:
    """The archive for `lib`'s broker and this machine's `java`, made now
    when there is none (`on_progress` hears of it); None when it cannot be
    made (logged once)."""
    java = shutil.which("java")
    if java is None:
        return None
    archive = kafka_broker.class_archive_path(lib, java)
    failed = archive.with_suffix(".failed")
    if archive.is_file():
        return archive
    if failed.is_file():
        return None
    with open(archive.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be making it
        if archive.is_file() or failed.is_file():
            return archive if archive.is_file() else None
        started = time.monotonic()
        if on_progress is not None:
            on_progress("making a class archive of the broker's classes (once, a few seconds)")
        try:
            _make(lib, java, archive)
        except (ArchiveError, OSError, subprocess.SubprocessError, kafka_broker.BrokerSetupError
                ) as exc:
            failed.write_text(f"{exc}\n")
            log.warning("brokers start without a class archive (about a CPU second more "
                        "each)", reason=str(exc), marker=str(failed))
            return None
        log.info("made the broker's class archive (once)", path=str(archive),
                 seconds=round(time.monotonic() - started, 1))
    return archive


def _make(lib: Path, java: str, archive: Path) -> None:
    partial = archive.with_name(f"{archive.name}.{os.getpid()}.partial")
    partial.unlink(missing_ok=True)
    try:
        with tempfile.TemporaryDirectory(prefix="tokenmill-class-archive-") as tmp:
            _train(lib, Path(tmp), partial)
        check(java, lib, partial)
        os.replace(partial, archive)
    finally:
        partial.unlink(missing_ok=True)


def check(java: str, lib: Path, archive: Path) -> None:
    """The JVM maps `archive` and runs the broker's main class with it, or
    ArchiveError: `-Xshare:on` makes a bad archive an error, not a fallback."""
    checked = subprocess.run(
        # a bad archive can crash the JVM: its report goes nowhere, not to the cwd
        [java, "-Xshare:on", f"-XX:SharedArchiveFile={archive}", "-XX:ErrorFile=/dev/null",
         "-cp", f"{lib}/*", "kafka.Kafka", "--version"],
        capture_output=True, text=True, timeout=60, check=False)
    if checked.returncode != 0:
        raise ArchiveError(f"the archive did not map (-Xshare:on exit {checked.returncode}): "
                           f"{(checked.stdout + checked.stderr).strip()[-300:]}")


def _train(lib: Path, home: Path, partial: Path) -> None:
    """A single-node broker, started until it serves, then stopped cleanly."""
    node = kraft.Node(1, "127.0.0.1", processes.free_port(), processes.free_port())
    plan = kafka_broker.NodePlan(node=node, home=home / "kafka", heap="256m", quick_jvm=True)
    kafka_broker.prepare([plan], lib, kraft.new_cluster_id())
    argv = kafka_broker.broker_command(plan, lib)
    argv.insert(1, f"-XX:ArchiveClassesAtExit={partial}")
    server_log = plan.logs_dir / "server.log"
    with open(plan.log_path, "ab") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + TRAIN_TIMEOUT_S
        while "Kafka Server started" not in _text(server_log):
            if process.poll() is not None:
                raise ArchiveError(f"the training broker exited ({process.returncode}): "
                                   f"{_text(plan.log_path)[-300:]}")
            if time.monotonic() > deadline:
                raise ArchiveError(f"the training broker did not start in {TRAIN_TIMEOUT_S:.0f}s")
            time.sleep(0.2)  # poll of a wait loop
        process.terminate()
        code = process.wait(TRAIN_TIMEOUT_S)
        if code != 0 and code != 143:
            raise ArchiveError(f"the training broker exited {code} when stopped")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
    if not partial.is_file():
        raise ArchiveError("the JVM wrote no archive on exit")


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
