"""The pipeline outlives its brokers being bounced. On three brokers of the
test's own, workers and a sink run under a supervisor that restarts what
exits non-zero (tests/liveness/supervised.py) while each broker in turn is
bounced, hard (SIGKILL) and clean (SIGTERM), each time with requests in
flight, and a `read_committed` reader tails the completions as it goes
(like Apache Kafka's transactions_test.py): it sees every committed record
once, and nothing that is not committed in the end; S3 plus the
dead-letter topic hold every prompt exactly once."""

from __future__ import annotations

import threading
import time

import pytest
from kafka import KafkaConsumer

from tests.consumer.pipeline import make_prompts, wait_until
from tests.kafka_helpers import read_all
from tests.liveness.supervised import exactly_once, exits_were_clean, own_stack, supervised_run
from tokenmill.kafka import topics

pytestmark = [pytest.mark.broker, pytest.mark.s3, pytest.mark.slow, pytest.mark.timeout(1200)]

DOWN_S = 5.0  # each bounce keeps the broker down this long


class CommittedTail:
    """A `read_committed` reader (kafka-python) tailing the completions topic
    for the whole run; remembers every (partition, offset) it was given."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.seen: list[tuple[int, int]] = []
        self._stop = threading.Event()
        self._consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap,
                                       isolation_level="read_committed",
                                       auto_offset_reset="earliest", enable_auto_commit=False,
                                       group_id=None)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for batch in self._consumer.poll(timeout_ms=500).values():
                    self.seen.extend((r.partition, r.offset) for r in batch)
            except Exception:  # noqa: BLE001 - a bounced broker; the client reconnects
                self._stop.wait(0.5)  # poll of a wait loop: the next try

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()


def test_three_brokers_bounced_in_turn(private_stack, monkeypatch, run_id, tmp_path) -> None:
    stack = own_stack(private_stack, monkeypatch, 3)
    settings = stack.settings(state_dir=tmp_path / "state")
    prompts = make_prompts(run_id, 1800)
    tail = CommittedTail(settings.bootstrap_servers, topics.completions_topic(run_id))
    bounces = []
    try:
        # the run is held unfinished: its last prompts go out after the last bounce
        with supervised_run(settings, run_id, prompts, tmp_path) as run:
            for node_id, how in ((1, "hard"), (2, "clean"), (3, "hard")):
                # requests in flight, and some served since the last bounce
                served = run.pace.wait_mid_run(run.pace.served() + 20 if bounces else 300, 300)
                bounces.append((node_id, how, served))
                node = stack.broker(node_id)
                node.kill() if how == "hard" else node.stop()
                time.sleep(DOWN_S)  # a paced outage: the broker is down this long
                node.start()
                node.wait_ready()
                run.publisher.ahead(run.publisher.out, 400) if node_id < 3 else run.publisher.rest()
            run.supervisor.wait_all(900)
        final = {(r.partition, r.offset) for r in read_all(
            settings.bootstrap_servers, topics.completions_topic(run_id), timeout_s=120)}
        # the tailing reader catches up with everything committed
        wait_until(lambda: len(set(tail.seen)) >= len(final), 60, "the tail reading it all")
    finally:
        tail.close()
    exactly_once(settings, run_id, prompts)
    # it saw every committed record once, and nothing that is not committed in the end
    assert len(tail.seen) == len(set(tail.seen))
    assert set(tail.seen) == final
    print(f"bounces {bounces}; restarts {[s.restarts for s in run.services]}")
    exits_were_clean(run.services)
