"""The test session's broker and S3 server as containers: the Kafka and S3
images `tokenmill dev images` builds, started by testcontainers through
podman's Docker-compatible API (set up by tokenmill when missing).

The broker gets the dev stack's server.properties (as KAFKA_* variables),
listening on the same free port inside and outside the container so that
the address it advertises works from the host.
"""

from __future__ import annotations

import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from devstack import container_engine, images
from devstack.processes import free_port
from ops.deploy import kafka_image_environment
from tokenmill.kafka import kraft

START_TIMEOUT_S = 240.0
CONTROLLER_PORT = 9093


def built_images() -> images.Images:
    """The images, built when missing (xdist workers wait for each other)."""
    return images.build_images()


@contextmanager
def podman_api(socket_dir: Path) -> Iterator[container_engine.ApiService]:
    """This session's own API socket (stopped at its end), and the variables
    testcontainers reads, set before it is imported."""
    api = container_engine.start_api(socket_dir / "podman.sock")
    os.environ.update(api.env())
    try:
        yield api
    finally:
        api.stop()


def kafka_environment(port: int, cluster_id: str) -> dict[str, str]:
    """The dev stack's broker settings for a one-node cluster on `port`."""
    node = kraft.Node(1, "127.0.0.1", port, CONTROLLER_PORT)
    properties = kraft.server_properties([node], node, data_dir="/var/lib/kafka/data",
                                         cluster_id=cluster_id, listen_host="0.0.0.0")
    return {"CLUSTER_ID": cluster_id, "KAFKA_HEAP_OPTS": "-Xmx768m -Xms128m",
            **kafka_image_environment(properties)}


def _wait_for_http(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(url, timeout=3).close()
            return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the S3 container did not answer on {url} "
                                   f"within {timeout_s:.0f}s") from None
            time.sleep(0.3)  # poll of a wait loop


@contextmanager
def kafka_and_s3(built: images.Images) -> Iterator[tuple[str, str]]:
    """(bootstrap servers, S3 endpoint URL) of a broker and an S3 server in
    containers, removed at the end."""
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.waiting_utils import wait_for_logs

    port = free_port()
    kafka = DockerContainer(built.kafka).with_bind_ports(port, port)
    for key, value in kafka_environment(port, kraft.new_cluster_id()).items():
        kafka.with_env(key, value)
    s3 = DockerContainer(built.s3).with_exposed_ports(9000)
    with kafka, s3:
        wait_for_logs(kafka, "Kafka Server started", timeout=START_TIMEOUT_S)
        endpoint = f"http://{s3.get_container_host_ip()}:{s3.get_exposed_port(9000)}"
        _wait_for_http(endpoint, START_TIMEOUT_S)
        yield f"127.0.0.1:{port}", endpoint
