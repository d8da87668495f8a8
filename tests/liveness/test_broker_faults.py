"""The pipeline outlives its broker. On a broker of the test's own (never the
session's), workers and a sink run under a supervisor that restarts what
exits non-zero (tests/liveness/supervised.py) while a single broker is
SIGKILLed and restarted 7 s later, three times, each time with requests in
flight. The run finishes with no operator action, and S3 plus the
dead-letter topic hold every prompt exactly once (kafka-python and boto3,
sharing no code with tokenmill). The three brokers bounced in turn:
test_broker_bounces.py."""

from __future__ import annotations

import time

import pytest

from tests.consumer.pipeline import make_prompts
from tests.liveness.supervised import exactly_once, exits_were_clean, own_stack, supervised_run

pytestmark = [pytest.mark.broker, pytest.mark.s3, pytest.mark.slow, pytest.mark.timeout(1200)]

# Down at least this long (then as long as the broker takes to start): past
# the services' 6 s sessions, so every member is gone when it returns.
OUTAGE_S = 7.0


def test_a_single_broker_killed_three_times_mid_run(private_stack, monkeypatch, run_id,
                                                    tmp_path) -> None:
    stack = own_stack(private_stack, monkeypatch, 1)
    settings = stack.settings(state_dir=tmp_path / "state")
    prompts = make_prompts(run_id, 1800)
    broker = stack.broker(1)
    kills_at = []
    # the run is held unfinished: its last prompts go out after the last kill
    with supervised_run(settings, run_id, prompts, tmp_path) as run:
        for kill in range(3):
            # requests in flight, and some served since the last restart
            kills_at.append(run.pace.wait_mid_run(run.pace.served() + 20 if kill else 100, 300))
            broker.kill()
            time.sleep(OUTAGE_S)  # a paced outage: the broker is down this long
            broker.start()
            broker.wait_ready()
            run.publisher.ahead(run.publisher.out, 400) if kill < 2 else run.publisher.rest()
        run.supervisor.wait_all(900)
    exactly_once(settings, run_id, prompts)
    print(f"requests served at each kill {kills_at}; restarts "
          f"{ {s.name: s.restarts for s in run.services} }; exit codes "
          f"{[s.exit_codes for s in run.services]}")
    exits_were_clean(run.services)
