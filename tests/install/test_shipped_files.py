"""The files the package carries, their placeholders, the KRaft layout, and
the small parsers of the set-up path (Java versions, Maven's output)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devstack import kafka_broker, prerequisites
from tests.tools import require
from tokenmill import deploy_files
from tokenmill.kafka import kraft

SHIPPED_ROOT = Path(deploy_files.__file__).resolve().parents[1]  # the checkout

names = st.from_regex(r"[a-z][a-z0-9_]{0,12}", fullmatch=True)


@given(st.dictionaries(names, st.text(alphabet=st.characters(blacklist_characters="@")),
                       min_size=1, max_size=5),
       st.lists(st.text(alphabet=st.characters(blacklist_characters="@"), max_size=20),
                max_size=6))
def test_render_fills_every_placeholder_with_its_value(values: dict[str, str],
                                                        glue: list[str]) -> None:
    keys = sorted(values)
    template = "".join(f"{g}@{k}@" for g, k in zip(glue + [""] * len(keys), keys))
    rendered = deploy_files.render(template, values)
    assert not deploy_files.placeholders(rendered) - set(values.values())
    assert rendered == "".join(f"{g}{values[k]}" for g, k in zip(glue + [""] * len(keys), keys))


def test_render_refuses_a_placeholder_without_a_value() -> None:
    with pytest.raises(deploy_files.TemplateError, match="x.conf: no value for port, user"):
        deploy_files.render("User=@user@\nPort=@port@\nHost=@host@", {"host": "h"},
                            source="x.conf")


def test_systemd_and_email_like_text_is_not_a_placeholder() -> None:
    text = "sglang@.service tokenmill-consume@%i ${TOKENMILL_RUN} {{ $labels.instance }} a@b.c"
    assert deploy_files.placeholders(text) == set()
    assert deploy_files.render(text, {}) == text


def test_every_file_in_the_package_folder_is_listed_and_readable() -> None:
    on_disk = sorted(str(p.relative_to(SHIPPED_ROOT)) for top in deploy_files.SHIPPED
                     for p in (SHIPPED_ROOT / top).rglob("*")
                     if p.is_file() and "__pycache__" not in p.parts)
    folders = ("deploy/kafka", "deploy/systemd", "docker", "deploy/prometheus", "deploy/grafana")
    listed = [path for folder in folders for path in deploy_files.files_in(folder)]
    assert sorted(listed) == on_disk  # every folder is one of these
    assert "deploy/kafka/pom.xml" in listed
    assert "deploy/systemd/tokenmill-consume@.service" in listed
    assert "deploy/prometheus/alerts.yml" in listed and "deploy/grafana/tokenmill.json" in listed
    for path in listed:
        assert deploy_files.read_text(path)


def test_a_file_that_is_not_shipped_is_named() -> None:
    with pytest.raises(FileNotFoundError, match="deploy/kafka/nope.xml"):
        deploy_files.read_text("deploy/kafka/nope.xml")


def _properties(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines()
                if line.strip() and not line.startswith("#"))


def test_one_node_has_one_replica_of_everything() -> None:
    node = kraft.Node(1, "127.0.0.1", 9092, 9093)
    props = _properties(kraft.server_properties([node], node, data_dir="/d", cluster_id="c"))
    assert props["controller.quorum.voters"] == "1@127.0.0.1:9093"
    for key in ("offsets.topic.replication.factor", "transaction.state.log.replication.factor",
                "default.replication.factor", "min.insync.replicas",
                "transaction.state.log.min.isr"):
        assert props[key] == "1", key
    # The KIP-848 group settings stay in the broker config.
    assert props["group.consumer.min.session.timeout.ms"] == "3000"
    assert props["group.consumer.heartbeat.interval.ms"] == "2000"


def test_three_nodes_replicate_three_times_and_need_two_in_sync() -> None:
    nodes = [kraft.Node(i, f"k{i}", 9092, 9093) for i in (1, 2, 3)]
    configs = [_properties(kraft.server_properties(nodes, n, data_dir=f"/d{n.node_id}",
                                                   cluster_id="c", listen_host="0.0.0.0"))
               for n in nodes]
    for node, props in zip(nodes, configs):
        assert props["node.id"] == str(node.node_id)
        assert props["controller.quorum.voters"] == "1@k1:9093,2@k2:9093,3@k3:9093"
        assert props["advertised.listeners"] == f"PLAINTEXT://k{node.node_id}:9092"
        assert props["listeners"] == "PLAINTEXT://0.0.0.0:9092,CONTROLLER://0.0.0.0:9093"
        assert props["log.dirs"] == f"/d{node.node_id}"
        for key in ("offsets.topic.replication.factor",
                    "transaction.state.log.replication.factor",
                    "share.coordinator.state.topic.replication.factor",
                    "default.replication.factor"):
            assert props[key] == "3", key
        for key in ("min.insync.replicas", "transaction.state.log.min.isr",
                    "share.coordinator.state.topic.min.isr"):
            assert props[key] == "2", key


def test_a_node_outside_the_cluster_is_refused() -> None:
    nodes = [kraft.Node(1, "a", 1, 2)]
    with pytest.raises(ValueError):
        kraft.server_properties(nodes, kraft.Node(2, "b", 1, 2), data_dir="/d", cluster_id="c")


@pytest.mark.parametrize(("output", "major"), [
    ('openjdk version "17.0.15" 2025-04-15\nOpenJDK Runtime Environment', 17),
    ('openjdk version "21" 2023-09-19', 21),
    ('java version "1.8.0_392"', 8),
    ('openjdk version "11.0.2" 2019-01-15', 11),
    ("command not found", None),
])
def test_java_major_version(output: str, major: int | None) -> None:
    assert prerequisites.java_major(output) == major


def test_python_older_than_3_11_is_named() -> None:
    problem = prerequisites.python_problem((3, 9))
    assert problem is not None and "Python 3.11+" in problem and "3.9" in problem
    assert prerequisites.python_problem((3, 11)) is None


def test_maven_download_lines_give_progress() -> None:
    line = ("Downloaded from central: https://repo.maven.apache.org/maven2/org/apache/kafka/"
            "kafka_2.13/4.1.1/kafka_2.13-4.1.1.jar (6.6 MB at 5.2 MB/s)")
    assert kafka_broker.downloaded(line) == ("kafka_2.13-4.1.1.jar", 6_600_000)
    assert kafka_broker.downloaded(
        "Downloaded from central: https://x/y/a.pom (2.1 kB at 9 kB/s)") \
        == ("a.pom", 2100)
    assert kafka_broker.downloaded("Downloading from central: https://x/y/a.jar") is None
    assert kafka_broker.downloaded("[INFO] BUILD SUCCESS") is None


def test_maven_failure_is_one_line() -> None:
    output = ("[INFO] Scanning for projects...\n"
              "[ERROR] Failed to execute goal on project x: Could not resolve dependencies\n"
              "[ERROR] \n[ERROR] -> [Help 1]\n")
    assert kafka_broker.failure_line(output) == (
        "Failed to execute goal on project x: Could not resolve dependencies")
    assert kafka_broker.failure_line("Exception in thread main\n  boom\n") == "boom"


def _fake_bin(tmp_path: Path, java_version: str | None) -> Path:
    """A PATH with python (and a java that says `java_version`), no Maven."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    if java_version:
        java = bin_dir / "java"
        java.write_text(f"#!/bin/sh\necho 'openjdk version \"{java_version}\" 2019-01-15' >&2\n")
        java.chmod(0o755)
    return bin_dir


@pytest.mark.parametrize(("java_version", "says"), [
    (None, "Java 17+ (java is not on PATH"),
    ("11.0.2", "is Java 11)"),
])
def test_prerequisites_name_everything_missing_in_one_line(tmp_path: Path, java_version: str | None,
                                                           says: str) -> None:
    bin_dir = _fake_bin(tmp_path, java_version)
    result = subprocess.run(
        [str(bin_dir / "python3"), "-m", "devstack.prerequisites"],
        capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2],
        env={"PATH": str(bin_dir), "TOKENMILL_CACHE_DIR": str(tmp_path / "cache")})
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("missing: ") and says in lines[0] and "Maven (mvn" in lines[0]


def test_fetching_jars_without_java_and_maven_says_so_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENMILL_CACHE_DIR", str(tmp_path / "cache"))  # nothing cached
    monkeypatch.setenv("PATH", str(_fake_bin(tmp_path, None)))
    with pytest.raises(kafka_broker.BrokerSetupError) as error:
        kafka_broker.fetch_jars()
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("missing: Java 17+") and "Maven" in message


def _fake_maven(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> Path:
    """A `mvn` that runs `body` (with $OUT = -DoutputDirectory) and counts its
    calls in calls.txt; the real java stays on PATH."""
    bin_dir = tmp_path / "mvn-bin"
    bin_dir.mkdir()
    mvn = bin_dir / "mvn"
    mvn.write_text("#!/bin/sh\n"
                   f"echo call >> {tmp_path}/calls.txt\n"
                   'for a in "$@"; do case "$a" in -DoutputDirectory=*) OUT="${a#*=}";; esac; '
                   'done\n'
                   + body)
    mvn.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("TOKENMILL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "calls.txt"


def test_jar_fetch_shows_progress_and_happens_once(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    require("Java 17+", prerequisites.java_problem())
    calls = _fake_maven(tmp_path, monkeypatch, (
        "echo 'Downloaded from central: https://r/o/kafka-clients-4.1.1.jar (5.0 MB at 9 MB/s)'\n"
        "echo 'Downloaded from central: https://r/o/kafka_2.13-4.1.1.jar (6.5 MB at 9 MB/s)'\n"
        'touch "$OUT/kafka_2.13-4.1.1.jar"\n'))
    progress: list[str] = []
    lib = kafka_broker.fetch_jars(progress.append)
    assert (lib / "kafka_2.13-4.1.1.jar").is_file() and (lib / ".complete").is_file()
    assert any("1 files, 5.0 MB (kafka-clients-4.1.1.jar)" in line for line in progress)
    assert any("2 files, 11.5 MB (kafka_2.13-4.1.1.jar)" in line for line in progress)
    assert kafka_broker.fetch_jars() == lib
    assert calls.read_text().count("call") == 1  # cached: Maven is not asked again


def test_jar_fetch_failure_is_one_line_naming_the_log(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    require("Java 17+", prerequisites.java_problem())
    _fake_maven(tmp_path, monkeypatch, (
        "echo '[INFO] Scanning for projects...'\n"
        "echo '[ERROR] Failed to execute goal: Could not transfer artifact org.apache.kafka:"
        "kafka_2.13:jar:4.1.1 from/to central: repo.maven.apache.org: Temporary failure'\n"
        "echo '[ERROR] -> [Help 1]'\nexit 1\n"))
    with pytest.raises(kafka_broker.BrokerSetupError) as error:
        kafka_broker.fetch_jars()
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("Maven could not fetch Kafka's jars from Maven Central: "
                              "Failed to execute goal: Could not transfer artifact")
    log_path = Path(message.rsplit("(log: ", 1)[1].rstrip(")"))
    assert "Temporary failure" in log_path.read_text()
    cache = tmp_path / "cache" / f"kafka-{kafka_broker.KAFKA_VERSION}"
    assert not (cache / "lib" / ".complete").exists()
