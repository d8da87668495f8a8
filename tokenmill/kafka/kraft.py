"""The layout of a KRaft Kafka cluster of combined broker+controller nodes,
and the `server.properties` each node gets.

One place decides replication from the node count, for the local stack
(`tokenmill dev up --brokers N`) and for real hosts (`tokenmill deploy
systemd --kafka-hosts ...`): three replicas as soon as there are three
nodes, and writes need two in sync, so one node may be lost without losing
a committed record or stopping writes.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from tokenmill import deploy_files

CONFIG_TEMPLATE = "deploy/kafka/server.properties"


@dataclass(frozen=True)
class Node:
    node_id: int
    host: str  # the address clients and the other nodes reach it at
    kafka_port: int
    controller_port: int


def replication_factor(nodes: int) -> int:
    return min(nodes, 3)


def min_insync_replicas(nodes: int) -> int:
    return 2 if replication_factor(nodes) >= 3 else 1


def voters(nodes: Sequence[Node]) -> str:
    """`controller.quorum.voters`: every node, so the quorum is fixed at format time."""
    return ",".join(f"{n.node_id}@{n.host}:{n.controller_port}" for n in nodes)


def bootstrap(nodes: Sequence[Node]) -> str:
    return ",".join(f"{n.host}:{n.kafka_port}" for n in nodes)


def new_cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def server_properties(nodes: Sequence[Node], node: Node, *, data_dir: str, cluster_id: str,
                      listen_host: str | None = None) -> str:
    """The config of `node` in a cluster of `nodes`; `listen_host` is the
    interface it binds (default: its own address)."""
    if node not in nodes:
        raise ValueError(f"node {node.node_id} is not one of the cluster's nodes")
    if len({n.node_id for n in nodes}) != len(nodes):
        raise ValueError("node ids must be unique")
    return deploy_files.render_file(CONFIG_TEMPLATE, {
        "node_id": node.node_id,
        "voters": voters(nodes),
        "host": node.host,
        "listen_host": listen_host or node.host,
        "kafka_port": node.kafka_port,
        "controller_port": node.controller_port,
        "data_dir": data_dir,
        "cluster_id": cluster_id,
        "replication_factor": replication_factor(len(nodes)),
        "min_insync_replicas": min_insync_replicas(len(nodes)),
    })
