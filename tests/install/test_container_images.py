"""The pure parts of the container set-up: image cache keys, podman's
config, the Kafka image's environment-to-properties mapping (the inverse of
what `tokenmill deploy compose` writes), and the test fixtures' broker
settings. The builds themselves run in tests/e2e (`make test-containers`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from devstack import container_engine, images
from ops.deploy import kafka_image_environment
from tests.container_services import kafka_environment
from tokenmill import deploy_files
from tokenmill.kafka import kraft

ENTRYPOINT = deploy_files.root() / "docker" / "images" / "kafka" / "kafka-entrypoint.py"


def _entrypoint():
    spec = importlib.util.spec_from_file_location("kafka_entrypoint", str(ENTRYPOINT))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_content_key_ignores_order_and_sees_every_byte_and_name() -> None:
    parts = [("a", b"1"), ("b", b"2")]
    key = images.content_key(parts)
    assert images.content_key(list(reversed(parts))) == key
    assert images.content_key([("a", b"1"), ("b", b"3")]) != key
    assert images.content_key([("a", b"1"), ("c", b"2")]) != key
    # a name/content boundary cannot be shifted without changing the key
    assert images.content_key([("ab", b"")]) != images.content_key([("a", b"b")])


def test_source_key_changes_with_a_source_file_and_not_with_bytecode(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[project]\nversion = '1'\n")
    (tmp_path / "README.md").write_text("readme")
    for package in images.PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    before = images.content_key(images.source_parts(tmp_path))
    (tmp_path / "sink" / "__pycache__").mkdir()
    (tmp_path / "sink" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    assert images.content_key(images.source_parts(tmp_path)) == before
    (tmp_path / "sink" / "writer.py").write_text("x = 1\n")
    assert images.content_key(images.source_parts(tmp_path)) != before


def test_image_names_carry_the_key_and_a_local_alias() -> None:
    assert images.reference("kafka", "abc") == "localhost/tokenmill-kafka:abc"
    assert images.reference("tokenmill", "abc") == "localhost/tokenmill:abc"
    assert images.local_name("localhost/tokenmill-kafka:abc") == "localhost/tokenmill-kafka:local"


def test_the_project_image_builds_from_the_local_base_offline() -> None:
    dockerfile = images.tokenmill_dockerfile("tokenmill-0.1.0-py3-none-any.whl")
    assert "FROM ${BASE_IMAGE}" in dockerfile and "python:3.11-slim" not in dockerfile
    assert "pip install --no-cache-dir /opt/tokenmill/context/tokenmill-0.1.0-py3-none-any.whl " \
        "${PIP_OPTIONS}" in dockerfile


def test_podman_config_is_written_only_when_missing_or_different(tmp_path: Path) -> None:
    conf = tmp_path / "containers" / "containers.conf"
    assert container_engine.ensure_config(conf) is True
    assert 'runtime = "runc"' in conf.read_text() and "default_ulimits = []" in conf.read_text()
    assert container_engine.ensure_config(conf) is False
    conf.write_text("[engine]\n")
    assert container_engine.ensure_config(conf) is True


def test_missing_packages_names_the_debian_package(tmp_path: Path) -> None:
    present = tmp_path / "netavark"
    present.write_text("")
    assert container_engine.missing_packages({
        "netavark": str(present), "nope": str(tmp_path / "absent"), "shell": "sh",
        "ghost": "no-such-program-here"}) == ["nope", "ghost"]


def test_no_api_answers_on_a_socket_nobody_serves(tmp_path: Path) -> None:
    assert container_engine.api_answers(tmp_path / "podman.sock", timeout_s=1) is False


def test_testcontainers_gets_the_socket_without_ryuk_and_the_hosts_view() -> None:
    api = container_engine.ApiService(Path("/run/x/podman.sock"), None)
    assert api.env() == {"DOCKER_HOST": "unix:///run/x/podman.sock",
                         "TESTCONTAINERS_RYUK_DISABLED": "true",
                         "TESTCONTAINERS_CONNECTION_MODE": "docker_host"}


def test_kafka_image_reads_back_the_properties_compose_writes() -> None:
    node = kraft.Node(1, "kafka", 9092, 9093)
    properties = kraft.server_properties([node], node, data_dir="/d", cluster_id="c",
                                         listen_host="0.0.0.0")
    env = {**kafka_image_environment(properties), "KAFKA_HEAP_OPTS": "-Xmx1g", "PATH": "/bin"}
    written = dict(line.split("=", 1) for line in _entrypoint().properties(env).splitlines())
    wanted = dict(line.split("=", 1) for line in properties.splitlines()
                  if line.strip() and not line.startswith("#"))
    assert written == wanted


def test_the_test_broker_advertises_the_port_it_is_mapped_to() -> None:
    env = kafka_environment(41234, "cid")
    assert env["KAFKA_ADVERTISED_LISTENERS"] == "PLAINTEXT://127.0.0.1:41234"
    assert env["KAFKA_LISTENERS"].startswith("PLAINTEXT://0.0.0.0:41234,")
    assert env["CLUSTER_ID"] == "cid"


def test_the_image_sources_are_the_checkout_and_what_the_wheel_carries() -> None:
    """The packages hashed into the tokenmill image's tag are the packages and
    folders pyproject ships, read from this checkout."""
    import tomllib

    pyproject = tomllib.loads((images.PROJECT_ROOT / "pyproject.toml").read_text())
    setuptools = pyproject["tool"]["setuptools"]
    shipped = {name.split(".")[0] for name in setuptools["packages"]}
    shipped |= set(setuptools["package-dir"].values())
    assert set(images.PACKAGES) == shipped
    assert all((images.PROJECT_ROOT / package).is_dir() for package in images.PACKAGES)


def test_the_dependencies_image_pins_what_this_environment_runs(tmp_path: Path) -> None:
    """The deps image (the tokenmill image's base) installs pyproject's
    dependencies at the versions the tests ran with; its tag follows them."""
    from importlib.metadata import version

    (tmp_path / "pyproject.toml").write_text(
        '[project]\ndependencies = ["msgspec>=0.18", "click >=8.1", '
        '"no-such-package-here>=1"]\n')
    assert images.project_requirements(tmp_path) == [
        f"msgspec=={version('msgspec')}", f"click=={version('click')}",
        "no-such-package-here>=1"]
    declared = images.project_requirements(images.PROJECT_ROOT)
    assert len(declared) >= 10 and all("==" in pin for pin in declared)
