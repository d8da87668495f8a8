"""The ACLs per role, as data (no broker): what `tokenmill deploy acls`
prints is exactly what `role_acls` returns, and the grants keep each role to
its part of a run."""

from __future__ import annotations

import json
import shlex

import pytest
from click.testing import CliRunner

from tokenmill.cli import cli
from tokenmill.kafka import acls, topics

RUN = "qwen-r1"
SHARED = {topics.RUNS_TOPIC, acls.COMPACTED_READER_GROUP}
OPERATIONS = {"Read": "READ", "Write": "WRITE", "Create": "CREATE", "Describe": "DESCRIBE",
              "AlterConfigs": "ALTER_CONFIGS", "Alter": "ALTER"}
RESOURCES = {"--topic": "TOPIC", "--group": "GROUP", "--transactional-id": "TRANSACTIONAL_ID"}

Entry = tuple[str, str, str, str, str]  # principal, resource, pattern, name, operation


def key(acl: acls.Acl) -> Entry:
    return acl.principal, acl.resource, acl.pattern, acl.name, acl.operation


def parse_kafka_acls(lines: list[str]) -> set[Entry]:
    """The ACLs that `kafka-acls.sh` would add for these lines."""
    found: set[Entry] = set()
    for line in lines:
        if not line.startswith("kafka-acls.sh "):
            continue
        words = shlex.split(line)
        assert "--add" in words and words[words.index("--bootstrap-server") + 1]
        principal = words[words.index("--allow-principal") + 1]
        pattern = words[words.index("--resource-pattern-type") + 1].upper()
        (flag,) = [w for w in words if w in RESOURCES]
        name = words[words.index(flag) + 1]
        for i, word in enumerate(words):
            if word == "--operation":
                found.add((principal, RESOURCES[flag], pattern, name, OPERATIONS[words[i + 1]]))
    return found


def by_role(entries: list[acls.Acl], role: str) -> list[acls.Acl]:
    return [acl for acl in entries if acl.role == role]


def test_the_printed_commands_and_json_are_exactly_the_acls() -> None:
    entries = acls.role_acls(acls.Scope(run=RUN, parents=("qwen-r0",)))
    printed = parse_kafka_acls(acls.kafka_acls_commands(entries, bootstrap="k:9092"))
    assert printed == {key(acl) for acl in entries}
    document = json.loads(acls.acls_json(entries, acls.Scope(run=RUN)))
    assert {(a["principal"], a["resource_type"], a["pattern_type"], a["resource_name"],
             a["operation"]) for a in document["acls"]} == {key(acl) for acl in entries}
    assert len(acls.bindings(entries)) == len(entries) == len(set(map(key, entries)))


def test_the_cli_prints_the_same_commands() -> None:
    result = CliRunner().invoke(cli, ["deploy", "acls", "--run", RUN, "--bootstrap-servers",
                                      "k1:9093", "--worker-principal", "User:gpu"])
    assert result.exit_code == 0, result.output
    expected = acls.role_acls(acls.Scope(run=RUN), {"worker": "User:gpu"})
    assert parse_kafka_acls(result.output.splitlines()) == {key(acl) for acl in expected}
    assert "--bootstrap-server k1:9093" in result.output
    bad = CliRunner().invoke(cli, ["deploy", "acls", "--run", RUN, "--reader-principal", "reader"])
    assert bad.exit_code == 2 and "Type:name" in bad.output


def test_each_role_keeps_to_its_part_of_the_run() -> None:
    entries = acls.role_acls(acls.Scope(run=RUN))
    writes = {(a.role, a.name) for a in entries if a.operation == "WRITE" and a.resource == "TOPIC"}
    assert writes == {
        ("producer", topics.RUNS_TOPIC), ("producer", topics.prompts_topic(RUN)),
        ("producer", topics.progress_topic(RUN)),
        ("worker", topics.completions_topic(RUN)), ("worker", topics.progress_topic(RUN)),
        ("worker", topics.turns_topic(RUN)),
        ("sink", topics.dlq_topic(RUN)), ("sink", topics.progress_topic(RUN))}
    # Only the producer creates topics; nobody may delete or alter anything.
    assert {a.role for a in entries if a.operation == "CREATE"} == {"producer"}
    assert not [a for a in entries if a.operation in ("ALTER", "DELETE")]
    # Groups: each service joins its own, the reader and producer none.
    joins = {(a.role, a.name) for a in entries if a.resource == "GROUP" and a.operation == "READ"}
    assert joins == {("worker", topics.generate_group(RUN)), ("sink", topics.sink_group(RUN))}
    # The reader writes nothing, joins nothing, and does not read the prompts.
    reader = by_role(entries, "reader")
    assert {a.operation for a in reader} == {"READ", "DESCRIBE"}
    assert not [a for a in reader if a.resource == "TRANSACTIONAL_ID"]
    assert not [a for a in reader if a.name == topics.prompts_topic(RUN) and a.operation == "READ"]
    # Transactional ids: the producer its one, workers and sinks their own prefix.
    txns = {(a.role, a.name, a.pattern) for a in entries if a.resource == "TRANSACTIONAL_ID"}
    assert txns == {("producer", topics.transactional_id(RUN, "producer"), "LITERAL"),
                    ("worker", f"tokenmill.{RUN}.consumer.", "PREFIXED"),
                    ("sink", f"tokenmill.{RUN}.sink.", "PREFIXED")}
    assert topics.transactional_id(RUN, "consumer", "gpu0").startswith(f"tokenmill.{RUN}.consumer.")
    assert topics.transactional_id(RUN, "sink", "s0").startswith(f"tokenmill.{RUN}.sink.")


def test_every_name_but_the_two_shared_ones_is_the_runs() -> None:
    entries = acls.role_acls(acls.Scope(run=RUN))
    names = {a.name for a in entries} - SHARED
    assert all(name.startswith(f"tokenmill.{RUN}.") for name in names), names
    # Run ids have no dots, so no other run's names share that prefix.
    assert not acls.role_acls(acls.Scope(run="r1"))[0].name.startswith("tokenmill.r10.")
    assert {a.name for a in entries} & SHARED == SHARED
    shared = {(a.role, a.operation) for a in entries if a.name in SHARED}
    assert ("producer", "CREATE") in shared and ("reader", "WRITE") not in shared


def test_a_prefix_scope_is_coarse_and_says_so() -> None:
    entries = acls.role_acls(acls.Scope(run_prefix="qwen"))
    assert {a.name for a in entries} - SHARED == {"tokenmill.qwen"}
    assert all(a.pattern == "PREFIXED" for a in entries if a.name not in SHARED)
    assert any("cannot tell" in note for note in acls.notes(acls.Scope(run_prefix="qwen")))
    assert any("tokenmill.runs" in note for note in acls.notes(acls.Scope(run_prefix="r")))
    with pytest.raises(ValueError):
        acls.Scope(run_prefix="qwen", parents=("x",))
    with pytest.raises(ValueError):
        acls.Scope()


def test_a_replays_grants_reach_its_parent() -> None:
    entries = acls.role_acls(acls.Scope(run=RUN, parents=("qwen-r0",)))
    parent = {(a.role, a.name, a.operation) for a in entries if "qwen-r0" in a.name}
    assert ("worker", topics.prompts_topic("qwen-r0"), "READ") in parent
    assert ("producer", topics.dlq_topic("qwen-r0"), "READ") in parent
    assert ("reader", topics.dlq_topic("qwen-r0"), "READ") in parent
    assert not [p for p in parent if p[2] in ("WRITE", "CREATE")]


def documented_acls(run: str) -> set[Entry]:
    """The ACL table of docs/security.md, for `run` (a cell may list more
    names: `tokenmill.<run>.completions`, `.dlq`: same stem)."""
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    table = page.split("<!-- acl-table -->")[1].split("<!-- /acl-table -->")[0]
    kinds = {"topic": "TOPIC", "group": "GROUP", "transactional id": "TRANSACTIONAL_ID"}
    found: set[Entry] = set()
    for row in table.strip().splitlines()[2:]:
        cells_ = [c.strip() for c in row.strip("|").split("|")]
        role, resource, names, pattern, operations, _ = cells_
        cells = [n.strip().strip("`").replace("<run>", run) for n in names.split(",")]
        first = cells[0]
        for name in cells:
            full = first.rsplit(".", 1)[0] + name if name.startswith(".") else name
            for operation in operations.split(", "):
                found.add((f"User:{role}", kinds[resource], pattern.upper(), full, operation))
    return found


def test_the_manuals_table_is_exactly_the_acls() -> None:
    assert documented_acls(RUN) == {key(acl) for acl in acls.role_acls(acls.Scope(run=RUN))}
