"""The compose set-up `tokenmill deploy compose` writes, run for real by
podman-compose on the locally built images: Kafka, S3, two simulated GPUs
with a worker each and the sink process the demo's sample set; S3 lines plus
dead-letter records must equal the published prompt ids, none twice; `down`
leaves no container of the project behind.

It runs in `make test` beside the other files, among the first (tests/conftest.py
LONGEST_FIRST): on a clean machine its first step installs podman and builds
the images (about 3 minutes, mostly downloads and unpacking) while the other
test processes go on. Without podman and root it skips, and in CI fails.

The check reads Kafka and S3 from a one-off container on the project's
network with plain confluent-kafka and boto3 calls (no tokenmill code)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest

from devstack import container_engine
from devstack.demo import SAMPLE_DIR, sample_files
from tests import container_services, tools

pytestmark = [pytest.mark.containers, pytest.mark.slow, pytest.mark.timeout(1200)]

RUN = "compose1"
DONE_TIMEOUT_S = 600.0

# Prints {"published": [...], "s3": [...], "dlq": [...]} of run RUN once
# every published prompt is in S3 or the DLQ, or when the deadline (seconds,
# its second argument) passes: one container that looks every second, not a
# container started for each look.
CHECK = """
import json, sys, time, boto3, zstandard
from confluent_kafka import Consumer, KafkaError, TopicPartition

def read(topic):
    consumer = Consumer({"bootstrap.servers": "kafka:9092", "group.id": "compose-check",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "enable.partition.eof": True})
    meta = consumer.list_topics(topic, timeout=30).topics[topic]
    if meta.error is not None:
        return []
    consumer.assign([TopicPartition(topic, p, -2) for p in meta.partitions])
    pending, records = set(meta.partitions), []
    while pending:
        message = consumer.poll(30)
        if message is None:
            sys.exit(f"no record nor end of {topic} within 30 s")
        if message.error() is not None:
            if message.error().code() == KafkaError._PARTITION_EOF:
                pending.discard(message.partition())
                continue
            sys.exit(str(message.error()))
        records.append(message)
    consumer.close()
    return records

def s3_ids():
    s3 = boto3.client("s3", endpoint_url="http://s3:9000", region_name="us-east-1")
    ids = []
    if any(b["Name"] == "tokenmill" for b in s3.list_buckets()["Buckets"]):
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket="tokenmill"):
            for item in page.get("Contents", []):
                if "/partition=" not in item["Key"]:
                    continue  # the sink's start-up store check's scratch keys, for one
                body = s3.get_object(Bucket="tokenmill", Key=item["Key"])["Body"].read()
                if item["Key"].endswith(".zst"):
                    body = zstandard.ZstdDecompressor().decompressobj().decompress(body)
                ids += [json.loads(line)["id"] for line in body.splitlines() if line.strip()]
    return ids

run, deadline = sys.argv[1], time.monotonic() + float(sys.argv[2])
while True:
    seen = {"published": [m.key().decode() for m in read(f"tokenmill.{run}.prompts")],
            "dlq": [json.loads(m.value())["id"] for m in read(f"tokenmill.{run}.dlq")],
            "s3": s3_ids()}
    done = seen["published"] and set(seen["s3"]) | set(seen["dlq"]) >= set(seen["published"])
    if done or time.monotonic() > deadline:
        break
    time.sleep(1)  # the poll of this wait loop
print(json.dumps(seen))
"""


class ComposeProject:
    """podman-compose on one project (its own name, so its containers and
    network are its own)."""

    def __init__(self, directory: Path, name: str) -> None:
        self.directory, self.name = directory, name

    def run(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["podman-compose", "-p", self.name, "-f",
                               str(self.directory / "compose.yaml"), *args],
                              capture_output=True, text=True, timeout=timeout)

    def containers(self) -> list[str]:
        listed = subprocess.run(["podman", "ps", "-a", "--format", "{{.Names}}", "--filter",
                                 f"label=io.podman.compose.project={self.name}"],
                                capture_output=True, text=True, timeout=60, check=True)
        return listed.stdout.split()

    def logs(self) -> str:
        return "\n".join(
            f"--- {name}\n" + subprocess.run(["podman", "logs", "--tail", "15", name],
                                             capture_output=True, text=True).stderr[-2000:]
            for name in self.containers())


    def one_off(self, image: str, *args: str, options: tuple[str, ...] = (),
                timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """A container on the project's network, as `compose run` would start
        (podman-compose 1.0.3's `run` drops `-v` and always exits 0)."""
        return subprocess.run(
            ["podman", "run", "--rm", "--network", f"{self.name}_default",
             "-e", "TOKENMILL_BOOTSTRAP_SERVERS=kafka:9092",
             "-e", "TOKENMILL_S3_ENDPOINT_URL=http://s3:9000",
             "-e", "TOKENMILL_S3_BUCKET=tokenmill",
             "-e", "AWS_ACCESS_KEY_ID=tokenmill", "-e", "AWS_SECRET_ACCESS_KEY=tokenmill-secret",
             "-e", "AWS_DEFAULT_REGION=us-east-1", *options, image, *args],
            capture_output=True, text=True, timeout=timeout)


def check(project: ComposeProject, image: str) -> dict[str, list[str]]:
    """What run RUN holds once it is done (or DONE_TIMEOUT_S passed)."""
    result = project.one_off(image, "-c", CHECK, RUN, str(DONE_TIMEOUT_S),
                             options=("--entrypoint", "python"), timeout=DONE_TIMEOUT_S + 120)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def engine_ready() -> str | None:
    """None when podman is there (set up first when missing, as root on
    Debian); else why not."""
    try:
        container_engine.ensure_engine()
    except container_engine.EngineError as exc:
        return str(exc)
    return None


def test_compose_stack_processes_the_sample_set_exactly_once(tmp_path: Path) -> None:
    tools.require("podman", engine_ready())
    built = container_services.built_images()
    out = tmp_path / "stack"
    written = subprocess.run(
        [sys.executable, "-m", "tokenmill.cli", "deploy", "compose", "--out", str(out),
         "--gpus", "2", "--run", RUN, "--time-scale", "400", "--image", built.tokenmill,
         "--kafka-image", built.kafka, "--s3-image", built.s3],
        capture_output=True, text=True, timeout=120)
    assert written.returncode == 0, written.stderr
    project = ComposeProject(out, f"tm{uuid.uuid4().hex[:8]}")
    try:
        up = project.run("up", "-d")
        assert up.returncode == 0, up.stderr[-3000:]
        files = [f"/data/{path.name}" for path in sample_files()]
        produce = project.one_off(built.tokenmill, "produce", *files, "--run", RUN,
                                  "--gpus", "2", "--max-tokens", "4096", "--no-progress",
                                  options=("-v", f"{SAMPLE_DIR}:/data:ro"))
        assert produce.returncode == 0, produce.stdout[-3000:] + produce.stderr[-3000:]

        seen = check(project, built.tokenmill)
        assert seen["published"] and \
            set(seen["s3"]) | set(seen["dlq"]) >= set(seen["published"]), \
            f"not done in {DONE_TIMEOUT_S:.0f}s: {len(seen['s3'])} in S3, " \
            f"{len(seen['dlq'])} in the DLQ of {len(seen['published'])}\n{project.logs()}"
    finally:
        down = project.run("down", timeout=300)
        subprocess.run(["podman", "network", "rm", "-f", f"{project.name}_default"],
                       capture_output=True, timeout=60)
    assert down.returncode == 0, down.stderr[-3000:]
    assert project.containers() == []

    published = seen["published"]
    assert len(published) == len(set(published)) > 100
    everything = Counter(seen["s3"]) + Counter(seen["dlq"])
    assert [key for key, count in everything.items() if count > 1] == []
    assert set(everything) == set(published)
    assert seen["dlq"], "the sample set has prompts that end in the dead-letter topic"
