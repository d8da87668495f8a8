"""How every benchmark times a side: launch a process, note the wall clock
when its last record is committed (or, for a baseline, when it reports its
last answer), and read its CPU seconds and peak RSS from the kernel when it
exits. tokenmill's side therefore includes interpreter start-up, imports,
group join and the final commit; CPU seconds are reported apart."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaException, TopicPartition

from tokenmill import progress
from tokenmill.kafka import clients
from tokenmill.settings import Settings

POLL_S = 0.05


@dataclass
class Exited:
    code: int
    cpu_s: float  # user + system, every thread, launch to exit
    peak_rss_bytes: int
    stdout: str
    ended_at: float  # wall clock (epoch) when it was seen to exit, within 50 ms


class Launched:
    """A child process and the wall clock at its launch (epoch seconds, so a
    child can report its own moments on the same clock)."""

    def __init__(self, argv: list[str], *, env: Mapping[str, str], log: Path,
                 cwd: Path | None = None, cores: set[int] | None = None,
                 own_session: bool = False) -> None:
        self.log = log
        self.argv = argv
        self._out = tempfile.TemporaryFile()  # noqa: SIM115 - closed at exit
        self._err = log.open("wb")
        self.launched_at = time.time()
        self.proc = subprocess.Popen(argv, env=dict(env), cwd=cwd, stdout=self._out,
                                     stderr=self._err, start_new_session=own_session)
        if cores:  # before the child's imports finish and start any thread
            try:
                os.sched_setaffinity(self.proc.pid, cores)
            except OSError:
                pass
        self._exited: Exited | None = None
        self.killed = False

    def poll_exit(self, timeout_s: float = 0.0) -> Exited | None:
        """The exit (with its rusage) once the child has ended; None while it runs."""
        deadline = time.monotonic() + timeout_s
        while self._exited is None:
            pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:
                self.proc.returncode = os.waitstatus_to_exitcode(status)
                self._out.seek(0)
                self._exited = Exited(self.proc.returncode, usage.ru_utime + usage.ru_stime,
                                      usage.ru_maxrss * 1024, self._out.read().decode(),
                                      time.time())
                self._out.close()
                self._err.close()
                break
            if time.monotonic() >= deadline:
                return None
            time.sleep(POLL_S)
        return self._exited

    def wait(self, timeout_s: float) -> Exited:
        exited = self.wait_or_kill(timeout_s)
        if self.killed:
            raise RuntimeError(f"{self.argv[:4]} did not exit within {timeout_s:.0f}s; "
                               f"log: {self.log}")
        return exited

    def wait_or_kill(self, timeout_s: float) -> Exited:
        """The exit; a child still running after `timeout_s` is killed
        (`killed` tells) and its rusage read all the same."""
        exited = self.poll_exit(timeout_s)
        if exited is None:
            self.killed = True
            self.proc.kill()
            exited = self.poll_exit(30)
            assert exited is not None
        return exited

    def kill(self) -> None:
        if self._exited is None:
            self.proc.kill()
            self.poll_exit(30)


def wait_until(done: Callable[[], bool], processes: list[Launched], timeout_s: float,
               what: str) -> float:
    """Wall clock (epoch) at which `done()` first held, polled every 50 ms.
    A process that exits before then with a non-zero code ends the wait."""
    deadline = time.monotonic() + timeout_s
    while True:
        if done():
            return time.time()
        for p in processes:
            exited = p.poll_exit()
            if exited is not None and exited.code != 0:
                raise RuntimeError(f"{p.argv[:4]} exited with {exited.code} before "
                                   f"{what}; log: {p.log}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} within {timeout_s:.0f}s")
        time.sleep(POLL_S)


class CommittedReached:
    """A check: has `group` committed, on every partition, an offset past the
    last record fed to it (`ends`: partition -> last offset + 1)? Offsets
    are committed in the same transaction as the results, so this is the
    moment the last result became visible to read_committed readers.

    Asked through a consumer of the group that never subscribes (so never
    joins): librdkafka's admin ListConsumerGroupOffsets crashes the process
    when the group's coordinator is still loading."""

    def __init__(self, settings: Settings, group: str, topic: str,
                 ends: Mapping[int, int]) -> None:
        self.ends = dict(ends)
        self._wanted = [TopicPartition(topic, p) for p in sorted(ends)]
        self._consumer = clients.consumer(settings, group)

    def __call__(self) -> bool:
        try:
            answer = self._consumer.committed(self._wanted, timeout=10)
        except KafkaException:
            return False
        got = {tp.partition: tp.offset for tp in answer if not tp.error}
        return all(got.get(p, -1) >= end for p, end in self.ends.items())

    def close(self) -> None:
        self._consumer.close()


class ProgressReached:
    """A check: do the run's committed counters (written in the same
    transaction as the results) count a result for every published prompt?
    For regenerate-turns runs, whose turns topic grows while they run."""

    def __init__(self, settings: Settings, run_id: str) -> None:
        self._tail = progress.ProgressTail(settings, run_id)

    def __call__(self) -> bool:
        try:
            return self._tail.glance().generation_done
        except progress.ProgressUnavailable:
            return False

    def close(self) -> None:
        self._tail.close()


class DeliveredEnds:
    """A producer's delivery callback that keeps, per partition, the offset
    after the last record written: what a consumer group must commit to
    have processed everything."""

    def __init__(self) -> None:
        self.ends: dict[int, int] = {}

    def __call__(self, err: object, msg: object) -> None:
        if err is not None:
            raise RuntimeError(f"delivery failed: {err}")
        partition, offset = msg.partition(), msg.offset()  # type: ignore[attr-defined]
        self.ends[partition] = max(self.ends.get(partition, 0), offset + 1)
