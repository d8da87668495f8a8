"""How a service command ends (tokenmill.commandline.run_service): its exit
code, or one `Error:` line and exit code 1 when it cannot go on."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import sys
from confluent_kafka import KafkaError, KafkaException
from tokenmill.commandline import run_service
from tokenmill.kafka.transactions import KafkaFatal

class Broken(RuntimeError):
    pass

def service():
    how = sys.argv[1]
    if how == "fatal":
        raise KafkaFatal("another process took over transactional id t")
    if how == "kafka":
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "broker gone"))
    if how == "own":
        raise Broken("the server went away for good")
    if how == "timeout":
        raise TimeoutError("could not read t [0] to offset 9 in 60s")
    if how == "other":
        raise ValueError("a bug")
    return 3

sys.exit(run_service(service, fatal=(Broken,)))
"""


@pytest.mark.parametrize(("how", "code", "line"), [
    ("fatal", 1, "Error: another process took over transactional id t"),
    ("kafka", 1, "Error: kafka: KafkaError{code=_TRANSPORT,val=-195,str=\"broker gone\"}"),
    ("own", 1, "Error: the server went away for good"),
    ("timeout", 1, "Error: gave up waiting: could not read t [0] to offset 9 in 60s"),
    ("ok", 3, None),
])
def test_a_service_ends_with_its_code_or_one_error_line(how: str, code: int,
                                                       line: str | None) -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT, how], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == code
    if line is None:
        assert done.stderr == ""
    else:
        assert done.stderr.strip() == line


def test_other_errors_propagate() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT, "other"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1 and "Traceback" in done.stderr and "ValueError" in done.stderr


def test_a_kafka_failure_at_start_up_is_one_line_naming_the_broker() -> None:
    """A broker restarting past a start-up read's timeout (seen in the
    broker-fault test: a registry read at a worker's start) is one line
    through the commands' wrapper, not a traceback."""
    from confluent_kafka import KafkaError, KafkaException

    from tokenmill.commandline import kafka_failure
    from tokenmill.settings import Settings

    settings = Settings(bootstrap_servers="b1:9092")
    timed_out = KafkaException(KafkaError(KafkaError._TIMED_OUT,
                                          "Failed to query partition leaders"))
    assert kafka_failure(settings, timed_out) == (
        "Kafka at b1:9092 failed: Failed to query partition leaders (_TIMED_OUT); "
        "is a broker down or restarting?")
    assert kafka_failure(settings, ValueError("a bug")) is None
