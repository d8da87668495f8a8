"""`tokenmill status` tells the truth about a broken fleet (issue 12), on
the real broker: dead workers and sinks are marked dead within two
heartbeat intervals and the run stalled (`--check` exits 2 naming it), a
cleanly stopped worker is `stopped`, a full KV cache says the batch cannot
grow, and a frozen S3 server shows up as a sink warning."""

from __future__ import annotations

import json
import os
import re
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import msgspec
import pytest
from click.testing import CliRunner

from devstack import processes, s3_server
from sglang_sim import SimulatorConfig
from sglang_sim.runner import SimulatorProcess
from tests.consumer.pipeline import (
    ConsumerProcess,
    Publisher,
    check_exactly_once,
    create_run,
    make_prompts,
    wait_until,
)
from tests.sink.sink_helpers import sink_env, start_sink
from tokenmill import progress
from tokenmill.cli import cli
from tokenmill.settings import Settings

pytestmark = [pytest.mark.broker, pytest.mark.slow]

HEARTBEAT_S = 3.0
# Long answers (~250 tokens, 1.5-5 s each): a few fill gpu0's small KV pool.
# Not slower: a worker commits its results in offset order, so the run's
# first persisted result waits for its partition's first answer.
SLOW = SimulatorConfig(decode_rate=80.0, length_median=250, length_sigma=0.3, length_max=400,
                       prefill_rate=0, max_running_requests=64)


def status(settings: Settings, run_id: str, *flags: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["status", "--run", run_id, "--bootstrap-servers",
                                      settings.bootstrap_servers, *flags],
                                env={"COLUMNS": "250"})  # wide tables: whole lines
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def report(settings: Settings, run_id: str) -> dict[str, Any]:
    code, output = status(settings, run_id, "--json")
    assert code == 0, output
    return json.loads(output)


def states(document: dict[str, Any], key: str) -> dict[str, str]:
    return {row["instance"]: row["state"] for row in document[key]}


def shown_dead_on_time(settings: Settings, run_id: str, key: str, names: list[str]) -> None:
    """Looks at the run (`status --json`) until each member in `names` (just
    killed) must be shown dead: two heartbeat intervals after its last
    heartbeat (the `updated_at` of its last committed record, what `status`
    judges by). A look that ended before that must not show it dead (too
    early), and every look that began after it must (too late). A slow look
    delays nothing here: the verdict is checked against the looks' own
    times, not against a guess at how long a look takes."""
    members = getattr(progress.read_run_progress(settings, run_id), key)
    due = {name: members[name].updated_at + 2 * HEARTBEAT_S for name in names}
    while True:
        began = time.time()
        shown = states(report(settings, run_id), "instances" if key == "consumers" else key)
        ended = time.time()
        for name in names:
            if ended < due[name]:
                assert shown[name] != "dead", f"{name} shown dead too early: {shown}"
            if began >= due[name]:
                assert shown[name] == "dead", f"{name} not shown dead in time: {shown}"
        if all(began >= at for at in due.values()):
            return
        time.sleep(0.2)  # poll of a wait loop


def _worker(settings: Settings, run_id: str, url: str, name: str, tmp_path: Path
            ) -> ConsumerProcess:
    return ConsumerProcess(settings, run_id, url, name, tmp_path, "--concurrency", "16",
                           "--heartbeat-interval", str(HEARTBEAT_S))


def test_dead_workers_and_sink_are_marked_dead_and_the_run_stalled(settings, run_id,
                                                                   tmp_path) -> None:
    spec = create_run(settings, run_id, partitions=3, max_tokens=512)
    # Held: half the run's prompts are published, never the rest, so the run
    # cannot finish while the test looks, however fast it goes.
    Publisher(settings, spec, make_prompts(run_id, 1200)).to(600)
    # gpu0's server has a tiny KV pool: its cache is full at a few requests.
    sims = [SimulatorProcess(msgspec.structs.replace(SLOW, max_total_num_tokens=500)),
            SimulatorProcess(SLOW)]
    workers: list[ConsumerProcess] = []
    sink = None
    try:
        urls = [sim.start() for sim in sims]
        workers = [_worker(settings, run_id, url, f"gpu{i}", tmp_path).start()
                   for i, url in enumerate(urls)]
        workers.append(_worker(settings, run_id, urls[1], "gpu2", tmp_path).start())
        sink_log = tmp_path / "sink.log"
        sink = start_sink(settings, run_id, "--instance", "s0", "--batch-size", "5",
                          "--max-batch-age", "1", "--heartbeat-interval", str(HEARTBEAT_S),
                          "--session-timeout", "6", log_path=sink_log)

        def healthy() -> bool:
            document = report(settings, run_id)
            return (states(document, "instances") == {"gpu0": "active", "gpu1": "active",
                                                      "gpu2": "active"}
                    and states(document, "sinks") == {"s0": "active"}
                    and document["persisted"] > 0
                    and all(w["server"] for w in document["instances"]))
        wait_until(healthy, 120, "three live workers and a live sink")
        code, output = status(settings, run_id, "--check")
        assert code == 0 and output.startswith(f"OK: run {run_id} running"), output

        # The GPU's side: gpu0's full KV cache means its batch cannot grow
        # (each look is one reading of the server: check within one output).
        def kv_full() -> bool:
            rows = {w["instance"]: w for w in report(settings, run_id)["instances"]}
            room = rows["gpu0"]["headroom"]
            return room["verdict"] == "no" and room["reason"].startswith("KV cache")
        wait_until(kv_full, 60, "gpu0's server reporting a full KV cache (--json)")

        def kv_full_shown() -> bool:
            text = status(settings, run_id)[1]
            return "batch can grow?" in text and re.search(r"no: KV cache (9\d|100)% used",
                                                           text) is not None
        wait_until(kv_full_shown, 60, "status showing gpu0's batch cannot grow")

        # A worker stopped cleanly is `stopped`, not dead, and no problem.
        workers[2].terminate()
        assert workers[2].wait(60) == 0
        document = report(settings, run_id)
        assert states(document, "instances")["gpu2"] == "stopped"
        assert not [p for p in document["health"]["problems"] if "gpu2" in p["subject"]]

        # The sink dies: within two heartbeat intervals it is dead, and the
        # run (results waiting, no live sink) stalled.
        sink.send_signal(signal.SIGKILL)
        sink.wait(10)
        shown_dead_on_time(settings, run_id, "sinks", ["s0"])
        wait_until(lambda: status(settings, run_id, "--check")[0] == 2, 30,
                   "--check critical without a live sink")
        code, output = status(settings, run_id, "--check")
        assert "CRITICAL: run: stalled: no live sink" in output and run_id in output

        # Every worker dies: dead within two heartbeats, rates and in-flight
        # stop counting, the run stalled with no live worker.
        for worker in workers[:2]:
            worker.kill()
        shown_dead_on_time(settings, run_id, "consumers", ["gpu0", "gpu1"])
        document = report(settings, run_id)
        assert states(document, "instances") == {"gpu0": "dead", "gpu1": "dead",
                                                  "gpu2": "stopped"}
        assert document["health"]["state"] == "stalled"
        assert document["recent_requests_per_s"] == 0 and document["in_flight"] == 0
        assert all(w["in_flight"] == 0 for w in document["instances"])
        code, output = status(settings, run_id, "--check")
        assert code == 2, output
        lines = output.splitlines()
        assert any(line.startswith("CRITICAL: run: stalled: no live worker") for line in lines)
        assert any(line.startswith("WARNING: worker gpu0: dead") for line in lines)
        assert all(run_id in line for line in lines)
        code, text = status(settings, run_id)
        assert code == 0 and "STALLED" in text and "dead" in text
    finally:
        for worker in workers:
            worker.stop()
        if sink is not None and sink.poll() is None:
            sink.kill()
        for sim in sims:
            sim.terminate()


def wait_for_s3_warning(settings: Settings, run_id: str, stall_s: float, sink_log: Path,
                        timeout_s: float) -> None:
    """Until `status --check` warns of sink s0's S3 call in flight for
    `stall_s` (exit 1); else fail with the last check and the sink's log."""
    last_check: list[str] = []

    def warned() -> bool:
        code, output = status(settings, run_id, "--check", "--upload-stall", f"{stall_s:g}")
        last_check[:] = [f"exit {code}: {output}"]
        return code == 1 and "WARNING: sink s0: S3 upload in flight for" in output
    try:
        wait_until(warned, timeout_s, f"--check warning of an S3 call in flight for {stall_s:g}s")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the last --check said {last_check}; sink log: "
                             f"{sink_log.read_text()[-3000:]}") from None


class OwnS3(msgspec.Struct):
    """An S3 server of the test's own (moto), for the test to freeze; Kafka
    stays the session's, so no broker starts for it."""

    url: str
    pid: int


@pytest.fixture
def own_s3(tmp_path: Path) -> Iterator[OwnS3]:
    port = processes.free_port()
    pid = processes.spawn(s3_server.command("127.0.0.1", port), tmp_path / "s3.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _answers(url), 60, "the test's own S3 server answering")
        yield OwnS3(url, pid)
    finally:
        os.kill(pid, signal.SIGCONT)
        processes.stop_all([pid])


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2).close()
    except urllib.error.HTTPError:
        return True  # an answer
    except OSError:
        return False
    return True


def s3_freeze_run(settings: Settings, s3: OwnS3, n: int, decode_rate: float,
                  published: int | None = None
                  ) -> tuple[Settings, str, list[Any], SimulatorProcess, Publisher]:
    """The session's Kafka with an S3 server of the test's own (frozen by the
    test), a run of n prompts on 2 partitions of which `published` (all by
    default) are published, their publisher, and a simulator not started yet."""
    settings = msgspec.structs.replace(settings, s3_endpoint_url=s3.url)
    boto3.client("s3", endpoint_url=s3.url, region_name="us-east-1").create_bucket(
        Bucket=settings.s3_bucket)
    run_id = f"t{os.urandom(6).hex()}"
    spec = create_run(settings, run_id, partitions=2, max_tokens=256)
    prompts = make_prompts(run_id, n)
    publisher = Publisher(settings, spec, prompts)
    publisher.to(n if published is None else published)
    sim = SimulatorProcess(SimulatorConfig(decode_rate=decode_rate, length_median=40,
                                           length_max=80, prefill_rate=0))
    return settings, run_id, prompts, sim, publisher


def thaw_and_finish(s3_pid: int, sink: Any, worker: ConsumerProcess, sink_log: Path) -> bool:
    """S3 resumes; the sink and the worker then finish the run. False: not frozen now."""
    os.kill(s3_pid, signal.SIGCONT)
    assert sink.wait(240) == 0, sink_log.read_text()[-3000:]
    assert worker.wait(60) == 0
    return False


def stop_all(frozen_pid: int | None, worker: ConsumerProcess | None, sink: Any,
             sim: SimulatorProcess) -> None:
    if frozen_pid is not None:
        os.kill(frozen_pid, signal.SIGCONT)
    if worker is not None:
        worker.stop()
    if sink is not None and sink.poll() is None:
        sink.kill()
    sim.terminate()


def test_a_frozen_s3_server_shows_as_a_sink_problem(settings, own_s3, tmp_path) -> None:
    # The run is held unfinished: a third of its prompts go out first, the rest
    # once S3 is frozen, so the sink has records to upload while it is.
    settings, run_id, prompts, sim, publisher = s3_freeze_run(
        settings, own_s3, 300, 400.0, published=100)
    s3_pid = own_s3.pid
    frozen = False
    worker = None
    sink = None
    try:
        url = sim.start()
        worker = ConsumerProcess(settings, run_id, url, "gpu0", tmp_path, "--concurrency", "4",
                                 "--heartbeat-interval", str(HEARTBEAT_S),
                                 "--until-done").start()
        sink_log = tmp_path / "sink.log"
        env = sink_env(settings)
        sink = start_sink(settings, run_id, "--instance", "s0", "--batch-size", "10",
                          "--max-batch-age", "0.5", "--heartbeat-interval", str(HEARTBEAT_S),
                          "--until-done", log_path=sink_log, env=env)
        wait_until(lambda: report(settings, run_id)["persisted"] >= 20, 120,
                   "the sink persisting")
        os.kill(s3_pid, signal.SIGSTOP)
        frozen = True
        publisher.rest()

        wait_for_s3_warning(settings, run_id, 3, sink_log, 60)
        document = report(settings, run_id)
        [row] = document["sinks"]
        # alive (a 3 s heartbeat is `stale` after 4.5 s: a loaded machine may show it)
        assert row["state"] in ("active", "stale") and row["uploading_for_s"] >= 3
        code, text = status(settings, run_id, "--upload-stall", "3")
        assert "WARNING: sink s0: S3 upload in flight" in text
        frozen = thaw_and_finish(s3_pid, sink, worker, sink_log)
    finally:
        stop_all(s3_pid if frozen else None, worker, sink, sim)
    check_exactly_once(settings, run_id, prompts)
    code, output = status(settings, run_id, "--check")
    assert code == 0 and "complete" in output, output


def test_s3_frozen_before_a_partitions_first_record_leaves_the_sink_alive(settings, own_s3,
                                                                          tmp_path) -> None:
    """A partition's first record makes the sink ask S3 which objects an
    earlier owner left. That lookup must not hold the sink's loop: with S3
    frozen from before the first record, the sink keeps its heartbeat and
    `status` shows an S3 call in flight, not a dead sink."""
    settings, run_id, prompts, sim, _ = s3_freeze_run(settings, own_s3, 60, 400.0)
    s3_pid = own_s3.pid
    frozen = False
    worker = None
    sink = None
    sink_log = tmp_path / "sink.log"
    try:
        url = sim.start()
        sink = start_sink(settings, run_id, "--instance", "s0", "--batch-size", "10",
                          "--max-batch-age", "0.5", "--heartbeat-interval", str(HEARTBEAT_S),
                          "--until-done", log_path=sink_log,
                          env=sink_env(settings))
        wait_until(lambda: "partitions assigned" in sink_log.read_text()
                   and states(report(settings, run_id), "sinks") == {"s0": "active"}, 120,
                   "the sink assigned both partitions, with nothing to read yet")
        os.kill(s3_pid, signal.SIGSTOP)
        frozen = True
        worker = ConsumerProcess(settings, run_id, url, "gpu0", tmp_path, "--concurrency", "8",
                                 "--heartbeat-interval", str(HEARTBEAT_S),
                                 "--until-done").start()
        wait_until(lambda: report(settings, run_id)["generated"] == len(prompts), 120,
                   "every prompt generated while S3 is frozen")
        # In flight for 10 s, and alive: it heartbeat past 2 intervals (6 s) of the freeze.
        wait_for_s3_warning(settings, run_id, 10, sink_log, 90)
        [row] = report(settings, run_id)["sinks"]
        assert row["state"] in ("active", "stale") and row["uploading_for_s"] >= 10, row
        frozen = thaw_and_finish(s3_pid, sink, worker, sink_log)
    finally:
        stop_all(s3_pid if frozen else None, worker, sink, sim)
    check_exactly_once(settings, run_id, prompts)
