"""The Kafka ACLs each tokenmill role needs, as data: one pure function
(`role_acls`) is the single source, rendered as `kafka-acls.sh` commands
(for operators), JSON, or confluent-kafka `AclBinding`s (what `tokenmill
deploy acls --apply` and the tests create through the Admin API).

Roles and the commands that run as them:

- `producer`: `produce`, `runs replay`, `runs redrive` (creates the run's
  topics, registers its spec, publishes prompts in transactions);
- `worker`: `consume` (reads prompts, writes completions and progress in
  transactions with the input offsets, one group per run);
- `sink`: `sink` (reads completions, writes the DLQ and progress in
  transactions, one group per run);
- `reader`: `status`, `spot-check`, `runs list|show`, `dataset`, `export`, `report`
  (reads; never writes a record, never joins a group).

What fits per-run ACLs and what does not: every topic, group and
transactional id of a run starts with `tokenmill.<run>.` (run ids have no
dots), so one run's resources are told apart from another's; but the kind
comes after the run (`tokenmill.<run>.prompts`), so a PREFIXED ACL over
several runs cannot tell prompts from completions: `Scope(run=...)` names
each topic and group literally (exact), `Scope(run_prefix=...)` can only
grant each role the union of what it needs on any of those runs' resources
(`notes` says so). Two resources are shared by all runs: the registry topic
`tokenmill.runs` and the assign-only reader group
`tokenmill.kafka.compacted-reader` (DESCRIBE only: it never joins).

Operations imply others (READ, WRITE, DELETE and ALTER imply DESCRIBE;
ALTER_CONFIGS implies DESCRIBE_CONFIGS), so no ACL here repeats an implied
one. Idempotent producers need WRITE on some topic (Kafka 3.0+, KIP-679);
brokers older than that also want IDEMPOTENT_WRITE on the cluster.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tokenmill.kafka import topics

Role = Literal["producer", "worker", "sink", "reader"]
ROLES: tuple[Role, ...] = ("producer", "worker", "sink", "reader")
ResourceKind = Literal["TOPIC", "GROUP", "TRANSACTIONAL_ID", "CLUSTER"]
PatternKind = Literal["LITERAL", "PREFIXED"]
Operation = Literal["READ", "WRITE", "CREATE", "DESCRIBE", "ALTER", "ALTER_CONFIGS"]

DEFAULT_PRINCIPALS: dict[str, str] = {role: f"User:{role}" for role in ROLES}
CLUSTER_NAME = "kafka-cluster"  # the one name a CLUSTER resource has
# The group of tokenmill's assign-only readers of compacted topics (the
# registry, progress): it never joins, but librdkafka looks its coordinator up.
COMPACTED_READER_GROUP = "tokenmill.kafka.compacted-reader"

WHAT_RUNS_AS: dict[Role, str] = {
    "producer": "tokenmill produce, runs replay, runs redrive",
    "worker": "tokenmill consume",
    "sink": "tokenmill sink",
    "reader": "tokenmill status, spot-check, runs list|show, dataset, export, report",
}

_PRINCIPAL = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*:[^\s:][^\s]*$")


def principal_problem(principal: str) -> str | None:
    """None for a principal like `User:producer`, else what is wrong."""
    return None if _PRINCIPAL.match(principal) else "expected Type:name, e.g. User:producer"


@dataclass(frozen=True, order=True)
class Acl:
    """One ALLOW entry: `principal` may do `operation` on the resource."""

    role: str
    resource: ResourceKind
    pattern: PatternKind
    name: str
    operation: Operation
    principal: str
    why: str = field(compare=False, default="")


@dataclass(frozen=True)
class Scope:
    """Which runs: exactly `run`, or every run whose id starts with
    `run_prefix` (coarse: see the module doc). `parents` are the runs a
    replay or redrive of `run` reads from (its parent, up to the root)."""

    run: str | None = None
    run_prefix: str | None = None
    parents: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if (self.run is None) == (self.run_prefix is None):
            raise ValueError("a scope is one run or one run prefix")
        if self.parents and self.run is None:
            raise ValueError("parent runs go with one run, not with a run prefix")

    def describe(self) -> str:
        if self.run is not None:
            parents = f" (reading from {', '.join(self.parents)})" if self.parents else ""
            return f"run {self.run}{parents}"
        return (f"every run whose id starts with {self.run_prefix!r}" if self.run_prefix
                else "every run")


class _Grants:
    """Collects the ACLs of one role."""

    def __init__(self, role: Role, principal: str) -> None:
        self.role, self.principal = role, principal
        self.acls: list[Acl] = []

    def add(self, resource: ResourceKind, name: str, operations: Iterable[Operation], why: str,
            pattern: PatternKind = "LITERAL") -> None:
        for operation in operations:
            self.acls.append(Acl(self.role, resource, pattern, name, operation, self.principal,
                                 why))


def _run_grants(grants: _Grants, run: str, parents: Sequence[str]) -> None:
    """The exact ACLs of one role for one run."""
    role = grants.role
    topic: ResourceKind = "TOPIC"
    group: ResourceKind = "GROUP"
    txn: ResourceKind = "TRANSACTIONAL_ID"
    prompts, completions = topics.prompts_topic(run), topics.completions_topic(run)
    dlq, progress = topics.dlq_topic(run), topics.progress_topic(run)
    turns = topics.turns_topic(run)
    if role == "producer":
        grants.add(topic, prompts, ("CREATE", "WRITE", "READ"),
                   "creates the run's prompts topic, publishes, reads its tail to resume")
        for name in (completions, dlq, turns):
            grants.add(topic, name, ("CREATE",), "creates the run's topics (turns: "
                       "regenerate-turns runs only)")
        grants.add(topic, progress, ("CREATE", "WRITE", "READ"),
                   "creates the progress topic, writes and reads the producer checkpoint")
        grants.add(group, f"{prompts}.tail-reader", ("DESCRIBE",),
                   "assign-only reader of the prompts topic's tail")
        grants.add(txn, topics.transactional_id(run, "producer"), ("WRITE",),
                   "the run's one transactional producer")
        for parent in parents:
            grants.add(topic, topics.dlq_topic(parent), ("READ",),
                       "redrive: reads the parent's dead letters")
            grants.add(topic, topics.progress_topic(parent), ("READ",),
                       "replay: reads the parent's producer checkpoint")
            grants.add(group, f"{topics.dlq_topic(parent)}.reader", ("DESCRIBE",),
                       "assign-only reader of the parent's DLQ")
    elif role == "worker":
        grants.add(topic, prompts, ("READ",), "consumes the prompts")
        grants.add(topic, turns, ("READ", "WRITE"),
                   "regenerate-turns runs: consumes and writes the next turns")
        grants.add(topic, completions, ("WRITE",), "writes results (in transactions)")
        grants.add(topic, progress, ("READ", "WRITE"),
                   "reads and writes its counters (in transactions)")
        grants.add(group, topics.generate_group(run), ("READ", "ALTER_CONFIGS"),
                   "joins the run's group, commits offsets in transactions, sets the "
                   "group's session timeout")
        grants.add(txn, topics.transactional_id(run, "consumer") + ".", ("WRITE",),
                   "one transactional producer per worker instance", "PREFIXED")
        for parent in parents:
            grants.add(topic, topics.prompts_topic(parent), ("READ",),
                       "replay: consumes the parent's prompts")
    elif role == "sink":
        grants.add(topic, completions, ("READ",), "consumes the results (read_committed)")
        grants.add(topic, dlq, ("WRITE",), "writes dead letters (in transactions)")
        grants.add(topic, progress, ("READ", "WRITE"),
                   "reads and writes its counters (in transactions)")
        grants.add(group, topics.sink_group(run), ("READ", "ALTER_CONFIGS"),
                   "joins the run's sink group, commits offsets in transactions, sets the "
                   "group's session timeout")
        grants.add(txn, topics.transactional_id(run, "sink") + ".", ("WRITE",),
                   "one transactional producer per sink instance", "PREFIXED")
    else:  # reader
        grants.add(topic, prompts, ("DESCRIBE",),
                   "status describes the workers' group, which needs its topic described")
        grants.add(topic, completions, ("READ",), "spot-check reads results")
        grants.add(topic, dlq, ("READ",), "dataset, export and spot-check read dead letters")
        grants.add(topic, progress, ("READ",), "status, dataset and export read the counters")
        grants.add(group, f"tokenmill.{run}.", ("DESCRIBE",),
                   "status describes the run's groups; assign-only readers", "PREFIXED")
        for parent in parents:
            grants.add(topic, topics.prompts_topic(parent), ("DESCRIBE",),
                       "lineage: the parent's group")
            for name in (topics.completions_topic(parent), topics.dlq_topic(parent),
                         topics.progress_topic(parent)):
                grants.add(topic, name, ("READ",), "lineage: reads the parent run")
            grants.add(group, f"tokenmill.{parent}.", ("DESCRIBE",),
                       "lineage: the parent run's assign-only readers", "PREFIXED")


# What each role does on any run's resources, for the coarse prefix scope.
_PREFIX_GRANTS: dict[Role, dict[ResourceKind, tuple[Operation, ...]]] = {
    "producer": {"TOPIC": ("CREATE", "WRITE", "READ"), "GROUP": ("DESCRIBE",),
                 "TRANSACTIONAL_ID": ("WRITE",)},
    "worker": {"TOPIC": ("READ", "WRITE"), "GROUP": ("READ", "ALTER_CONFIGS"),
               "TRANSACTIONAL_ID": ("WRITE",)},
    "sink": {"TOPIC": ("READ", "WRITE"), "GROUP": ("READ", "ALTER_CONFIGS"),
             "TRANSACTIONAL_ID": ("WRITE",)},
    "reader": {"TOPIC": ("READ",), "GROUP": ("DESCRIBE",)},  # READ: prompts can't be told apart
}


def role_acls(scope: Scope, principals: Mapping[str, str] | None = None,
              roles: Sequence[Role] = ROLES) -> list[Acl]:
    """Every ACL the roles need for `scope`, sorted and without duplicates."""
    chosen = {**DEFAULT_PRINCIPALS, **(principals or {})}
    found: dict[Acl, Acl] = {}
    for role in roles:
        grants = _Grants(role, chosen[role])
        # Shared by every run: the registry, and its assign-only reader group.
        registry_ops: tuple[Operation, ...] = (
            ("CREATE", "WRITE", "READ") if role == "producer" else ("READ",))
        grants.add("TOPIC", topics.RUNS_TOPIC, registry_ops,
                   "the run registry (shared by all runs)" + (
                       ": creates it if missing, registers run specs" if role == "producer"
                       else ""))
        grants.add("GROUP", COMPACTED_READER_GROUP, ("DESCRIBE",),
                   "assign-only reader of the registry and progress topics (shared)")
        if scope.run is not None:
            _run_grants(grants, scope.run, scope.parents)
        else:
            prefix = f"tokenmill.{scope.run_prefix}"
            for resource, operations in _PREFIX_GRANTS[role].items():
                grants.add(resource, prefix, operations,
                           f"any resource of the runs under {prefix!r}", "PREFIXED")
        for acl in grants.acls:
            found.setdefault(acl, acl)
    return sorted(found, key=_order)


def _order(acl: Acl) -> tuple[int, str, str, str, str]:
    """Roles in their pipeline order, then by resource."""
    order: tuple[str, ...] = ROLES
    rank = order.index(acl.role) if acl.role in order else len(order)
    return rank, acl.resource, acl.name, acl.pattern, acl.operation


def notes(scope: Scope) -> list[str]:
    """What an operator should know about these ACLs for this scope."""
    out = []
    if scope.run is None:
        out.append(
            "a run prefix cannot tell a run's topics apart (names are "
            "tokenmill.<run>.<kind>): each role gets the union of what it needs on every "
            "topic, group and transactional id under the prefix (a worker may write prompts, "
            "a sink may join the workers' group); grant per run (--run) where that matters")
        prefix = f"tokenmill.{scope.run_prefix}"
        if topics.RUNS_TOPIC.startswith(prefix) or COMPACTED_READER_GROUP.startswith(prefix):
            out.append(f"the prefix {prefix!r} also covers the shared "
                       f"{topics.RUNS_TOPIC} topic or {COMPACTED_READER_GROUP} group")
    else:
        out.append("the turns topic is used by regenerate-turns runs only; its ACLs are "
                   "harmless for other runs")
    return out


# --- renderings ---------------------------------------------------------------

_OPERATION_NAMES: dict[str, str] = {
    "READ": "Read", "WRITE": "Write", "CREATE": "Create", "DESCRIBE": "Describe",
    "ALTER": "Alter", "ALTER_CONFIGS": "AlterConfigs",
}
_RESOURCE_FLAGS: dict[str, str] = {
    "TOPIC": "--topic", "GROUP": "--group", "TRANSACTIONAL_ID": "--transactional-id",
    "CLUSTER": "--cluster",
}


def _grouped(acls: Iterable[Acl]) -> dict[tuple[str, str, str, str, str], list[Acl]]:
    """One entry per (role, principal, resource, pattern, name): what one
    kafka-acls.sh command adds."""
    out: dict[tuple[str, str, str, str, str], list[Acl]] = {}
    for acl in acls:
        out.setdefault((acl.role, acl.principal, acl.resource, acl.pattern, acl.name),
                       []).append(acl)
    return out


def kafka_acls_commands(acls: Sequence[Acl], *, bootstrap: str,
                        command_config: str = "admin.properties",
                        tool: str = "kafka-acls.sh") -> list[str]:
    """`kafka-acls.sh --add` commands, one per resource, with a comment line
    per role and per command saying what it is for."""
    lines: list[str] = []
    role = None
    for (acl_role, principal, resource, pattern, name), group in _grouped(acls).items():
        if acl_role != role:
            role = acl_role
            what = WHAT_RUNS_AS.get(acl_role, acl_role)  # type: ignore[call-overload]
            lines += ["", f"# {acl_role} ({principal}): {what}"]
        words = [tool, "--bootstrap-server", bootstrap, "--command-config", command_config,
                 "--add", "--allow-principal", principal]
        for acl in group:
            words += ["--operation", _OPERATION_NAMES[acl.operation]]
        words.append(_RESOURCE_FLAGS[resource])
        if resource != "CLUSTER":
            words.append(name)
        words += ["--resource-pattern-type", pattern.lower()]
        why = "; ".join(dict.fromkeys(acl.why for acl in group if acl.why))
        lines.append(f"# {why}")
        lines.append(" ".join(shlex.quote(word) for word in words))
    return lines[1:] if lines and lines[0] == "" else lines


def acls_json(acls: Sequence[Acl], scope: Scope) -> str:
    """The ACLs as JSON: one object per ACL entry, as the Admin API takes them."""
    document: dict[str, Any] = {
        "scope": {"run": scope.run, "run_prefix": scope.run_prefix,
                  "parents": list(scope.parents)},
        "notes": notes(scope),
        "acls": [{"role": acl.role, "principal": acl.principal, "host": "*",
                  "permission": "ALLOW", "operation": acl.operation,
                  "resource_type": acl.resource, "resource_name": acl.name,
                  "pattern_type": acl.pattern, "why": acl.why} for acl in acls],
    }
    return json.dumps(document, indent=2)


def bindings(acls: Iterable[Acl]) -> list[Any]:
    """confluent-kafka AclBindings, for `AdminClient.create_acls`."""
    from confluent_kafka.admin import (  # type: ignore[attr-defined, unused-ignore]
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    # librdkafka calls the CLUSTER resource type BROKER (the same code, 4).
    kinds = {"CLUSTER": ResourceType.BROKER}
    return [AclBinding(kinds.get(acl.resource) or ResourceType[acl.resource], acl.name,
                       ResourcePatternType[acl.pattern], acl.principal, "*",
                       AclOperation[acl.operation], AclPermissionType.ALLOW)
            for acl in acls]


def any_binding() -> Any:
    """A filter that matches every ACL, for `AdminClient.describe_acls`."""
    from confluent_kafka.admin import (  # type: ignore[attr-defined, unused-ignore]
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    # None matches any name, principal and host (the stubs say str).
    anything: Any = None
    return AclBindingFilter(ResourceType.ANY, anything, ResourcePatternType.ANY, anything,
                            anything, AclOperation.ANY, AclPermissionType.ANY)
