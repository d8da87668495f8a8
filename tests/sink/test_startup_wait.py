"""A sink started while its S3 endpoint is down waits for it (a log line says
so), and does its job once the endpoint comes up: every record of the run
lands in S3 exactly once."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from devstack import processes, s3_server
from tests.sink.sink_helpers import (
    assert_exactly_once,
    create_run,
    feed,
    good,
    make_spec,
    publish_done,
    sink_env,
    start_sink,
    wait,
    wait_for,
)
from tokenmill.settings import Settings

pytestmark = [pytest.mark.broker, pytest.mark.s3, pytest.mark.slow]


def test_sink_waits_for_s3_and_proceeds_when_it_comes_up(settings: Settings, run_id: str,
                                                          tmp_path: Path) -> None:
    spec = make_spec(run_id, partitions=2, bucket=settings.s3_bucket)
    create_run(settings, spec)
    records = [good(spec, i) for i in range(30)]
    feed(settings, spec, records)
    publish_done(settings, run_id, len(records))

    port = processes.free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "sink.log"
    env = sink_env(settings, TOKENMILL_S3_ENDPOINT_URL=endpoint,
                   TOKENMILL_STARTUP_TIMEOUT_S="180")
    sink = start_sink(settings, run_id, "--until-done", log_path=log_path, env=env)
    s3_pid = None
    try:
        wait_for(lambda: "S3 is not up yet; waiting" in log_path.read_text(), 90,
                 "the sink's waiting log line")
        assert sink.poll() is None, log_path.read_text()
        assert endpoint in log_path.read_text()

        s3_pid = processes.spawn(s3_server.command("127.0.0.1", port), tmp_path / "s3.out")
        assert wait(sink, 180, log_path) == 0, log_path.read_text()[-4000:]
        log = log_path.read_text()
        assert "S3 is up" in log
        assert "Traceback" not in log
        local = msgspec.structs.replace(settings, s3_endpoint_url=endpoint)
        assert_exactly_once(local, run_id, {r.id for r in records})
    finally:
        if sink.poll() is None:
            sink.kill()
            sink.wait(10)
        if s3_pid is not None:
            processes.stop(s3_pid)
