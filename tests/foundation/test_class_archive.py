"""The brokers' class archive (devstack/class_archive.py): made once per JDK
beside the cached jars, mapped by every broker and storage tool after it,
never put in place unless the JVM maps it, and its absence costs only time."""

from __future__ import annotations

from pathlib import Path

import pytest

from devstack import class_archive, kafka_broker
from tests.tools import require_on_path

pytestmark = [pytest.mark.broker]


def test_the_session_brokers_start_with_the_archive_made_once(services) -> None:  # type: ignore[no-untyped-def]
    # the session's stack was started (the `services` fixture): it made the archive
    lib = kafka_broker.fetch_jars()
    archive = class_archive.ensure(lib)
    assert archive is not None and archive.is_file()
    assert archive == kafka_broker.class_archive_path(lib, require_on_path("java"))
    assert not archive.with_suffix(".failed").exists()
    class_archive.check(require_on_path("java"), lib, archive)  # the JVM maps it
    plan = kafka_broker.NodePlan(node=None, home=Path("/x"), quick_jvm=True)  # type: ignore[arg-type]
    for main in ("kafka.Kafka", "kafka.tools.StorageTool"):
        assert f"-XX:SharedArchiveFile={archive}" in kafka_broker.java_command(plan, lib, main)


def test_a_truncated_archive_is_refused_not_mapped(tmp_path: Path) -> None:
    java = require_on_path("java")
    lib = kafka_broker.fetch_jars()
    archive = class_archive.ensure(lib)
    assert archive is not None
    truncated = tmp_path / "truncated.jsa"
    truncated.write_bytes(archive.read_bytes()[:1_000_000])  # a JVM killed mid-write
    with pytest.raises(class_archive.ArchiveError, match="did not map"):
        class_archive.check(java, lib, truncated)


def test_an_archive_that_cannot_be_made_is_tried_once_and_brokers_start_without(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require_on_path("java")
    monkeypatch.setenv("TOKENMILL_CACHE_DIR", str(tmp_path / "cache"))
    lib = kafka_broker.cache_dir() / "lib"
    lib.mkdir(parents=True)
    (lib / "not-kafka.jar").write_text("no broker classes here")
    heard: list[str] = []
    assert class_archive.ensure(lib, heard.append) is None
    assert len(heard) == 1 and "class archive" in heard[0]  # `dev up` says what it waits for
    failed = kafka_broker.class_archive_path(lib, require_on_path("java")).with_suffix(".failed")
    assert "formatting Kafka storage" in failed.read_text()
    assert class_archive.ensure(lib, heard.append) is None
    assert len(heard) == 1  # not tried again
    plan = kafka_broker.NodePlan(node=None, home=tmp_path, quick_jvm=True)  # type: ignore[arg-type]
    assert not any("SharedArchiveFile" in a
                   for a in kafka_broker.java_command(plan, lib, "kafka.Kafka"))
