"""Local container images built from Debian packages, Maven Central and PyPI
only (no image registry is needed): a base (Debian minbase with Python and a
JRE, by debootstrap), Kafka (the jars `tokenmill dev up` fetches), an S3
server (moto), tokenmill's dependencies, and tokenmill itself (the Dockerfile
`tokenmill deploy compose` writes, built on the dependencies' image), with
podman.

Each image's tag is a hash of what goes into it (files, package lists, the
base's tag), so a second build with nothing changed only asks podman whether
the tags exist. Python packages are downloaded as wheels on the host (its pip
knows the machine's proxy and certificates) and installed offline in the
build. Each image is also tagged `:local`, the name compose files use.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from devstack import container_engine, kafka_broker, prerequisites
from tokenmill import deploy_files
from tokenmill.log import get_logger

log = get_logger("devstack")

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = ("python3", "python3-venv", "openjdk-17-jre-headless", "ca-certificates")
REPOSITORY = "localhost"
LOCAL_TAG = "local"
PROJECT_ROOT = Path(__file__).resolve().parents[1]
# pyproject.toml's packages and shipped folders: what tokenmill's wheel carries.
PACKAGES = ("tokenmill", "schemas", "producer", "consumer", "sink", "ops", "sglang_sim",
            "devstack", "deploy", "docker")
# Never part of a copy of the source to build from (tests/install/
# test_wheel.py copies the same way): build output, and the caches of tools
# that may be writing them during the copy (CI runs mypy beside the tests: a
# copy once failed on a vanished .mypy_cache/3.11/cache.0.db-shm).
NOT_SOURCE_PATTERNS = (".git", ".venv", "build", "dist", ".tokenmill", "*.egg-info", "__pycache__",
                       "*.pyc", ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis",
                       "site")
# The image's wheel is built without the tests and benchmarks besides.
NOT_SOURCE = shutil.ignore_patterns(*NOT_SOURCE_PATTERNS, "tests", "bench")

Part = tuple[str, bytes]


class ImageBuildError(RuntimeError):
    """An image could not be built; the message names the step."""


@dataclass(frozen=True)
class Images:
    """The built images' content-hash references."""

    base: str
    kafka: str
    s3: str
    deps: str
    tokenmill: str

    def all(self) -> list[str]:
        return [self.base, self.kafka, self.s3, self.deps, self.tokenmill]


def content_key(parts: Iterable[Part]) -> str:
    """A short hash of named contents; the order of `parts` does not matter."""
    digest = hashlib.sha256()
    for name, data in sorted(parts):
        digest.update(f"{name}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()[:16]


def directory_parts(root: Path, prefix: str = "") -> list[Part]:
    """Every file below `root`, named by its relative path."""
    return [(prefix + str(path.relative_to(root)), path.read_bytes())
            for path in sorted(root.rglob("*")) if path.is_file()]


def source_parts(source: Path) -> list[Part]:
    """What tokenmill's wheel is built from: pyproject.toml, the README (the
    package's description) and the packages' files, without bytecode."""
    parts = [(name, (source / name).read_bytes()) for name in ("pyproject.toml", "README.md")]
    for package in PACKAGES:
        parts += [(name, data) for name, data in directory_parts(source / package, f"{package}/")
                  if "__pycache__" not in name and not name.endswith(".pyc")]
    return parts


def reference(name: str, key: str) -> str:
    return f"{REPOSITORY}/tokenmill-{name}:{key}" if name != "tokenmill" else \
        f"{REPOSITORY}/tokenmill:{key}"


def local_name(ref: str) -> str:
    """`localhost/tokenmill-kafka:<hash>` -> `localhost/tokenmill-kafka:local`."""
    return ref.rsplit(":", 1)[0] + f":{LOCAL_TAG}"


def base_key() -> str:
    return content_key([("suite", SUITE.encode()), ("mirror", MIRROR.encode()),
                        ("packages", " ".join(BASE_PACKAGES).encode()),
                        ("recipe", _recipe_text().encode())])


def _recipe_text() -> str:
    """The base recipe's own source: a change to how it is built is a new key."""
    import inspect

    return inspect.getsource(_build_base)


def s3_requirements() -> list[str]:
    """moto's S3 service and its HTTP server (flask), at the versions this
    environment runs (the `local` extra's): not moto[server], whose every
    other service's dependencies would double the image and its build time."""
    from importlib.metadata import version

    return [f"moto[s3]=={version('moto')}", f"flask=={version('flask')}",
            f"flask-cors=={version('flask-cors')}"]


def project_requirements(source: Path) -> list[str]:
    """tokenmill's dependencies (pyproject.toml's), pinned at the versions this
    environment runs, as the s3 image pins moto: the image runs what the host
    tested, and its tag changes when a version does."""
    import re
    import tomllib
    from importlib.metadata import PackageNotFoundError, version

    declared = tomllib.loads((source / "pyproject.toml").read_text())["project"]["dependencies"]
    pinned = []
    for requirement in declared:
        name = re.match(r"[A-Za-z0-9_.-]+", requirement)
        if name is None:
            raise ImageBuildError(f"pyproject.toml: cannot read the dependency {requirement!r}")
        try:
            pinned.append(f"{name.group()}=={version(name.group())}")
        except PackageNotFoundError:
            pinned.append(requirement)  # not installed here: pip picks a version
    return pinned


def _podman(*args: str, stdin: int | None = None, timeout: float = 1800) -> str:
    result = subprocess.run(["podman", *args], capture_output=True, text=True, stdin=stdin,
                            timeout=timeout)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise ImageBuildError(f"podman {' '.join(args[:2])} failed: {last}")
    return result.stdout


def exists(ref: str) -> bool:
    return subprocess.run(["podman", "image", "exists", ref]).returncode == 0


def _tag_local(ref: str) -> None:
    _podman("tag", ref, local_name(ref))


def _build_base(ref: str, work: Path) -> None:
    rootfs = work / "rootfs"
    result = subprocess.run(
        ["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
         SUITE, str(rootfs), MIRROR], capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        last = (result.stdout.strip().splitlines() or ["no output"])[-1]
        raise ImageBuildError(f"debootstrap of the base image failed: {last}")
    for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for entry in (rootfs / cache).glob("*"):
            if entry.is_file():
                entry.unlink()
    tar = subprocess.Popen(["tar", "--numeric-owner", "-C", str(rootfs), "-c", "."],
                           stdout=subprocess.PIPE)
    assert tar.stdout is not None  # stdout=PIPE
    try:
        _podman("import", "--change", 'CMD ["/bin/bash"]', "-", ref, stdin=tar.stdout.fileno())
    finally:
        tar.stdout.close()
        tar.wait()


def _download_wheels(requirements: list[str], into: Path) -> None:
    """Wheels of `requirements` and their dependencies, for an offline install."""
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check",
         "-w", str(into), *requirements], capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise ImageBuildError(f"pip could not fetch wheels of {' '.join(requirements)}: {last}")


def _build(ref: str, context: Path, base: str, *build_args: str) -> None:
    args = ["build", "--quiet", "--network=none", "-t", ref, "--build-arg", f"BASE_IMAGE={base}"]
    for arg in build_args:
        args += ["--build-arg", arg]
    _podman(*args, str(context))


def build_wheel(source: Path, into: Path) -> Path:
    """tokenmill's wheel as a release builds it: from a copy of the checkout
    (no stale build/ leaks in), with pip's build isolation."""
    copy = into.parent / "source"
    shutil.copytree(source, copy, ignore=NOT_SOURCE)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
         "--disable-pip-version-check", "-w", str(into), str(copy)],
        capture_output=True, text=True, timeout=600)
    wheels = sorted(into.glob("tokenmill-*.whl"))
    if result.returncode != 0 or not wheels:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise ImageBuildError(f"building tokenmill's wheel from {source} failed: {last}")
    return wheels[-1]


def tokenmill_dockerfile(wheel_name: str) -> str:
    """The Dockerfile `tokenmill deploy compose --wheel` writes."""
    return deploy_files.dockerfile(f"/opt/tokenmill/context/{wheel_name}")


def build_images(source: Path = PROJECT_ROOT,
                 on_progress: Callable[[str], None] = lambda _: None) -> Images:
    """Build whichever image is missing; return all four references. One
    build at a time per cache directory: others wait, then find the images."""
    container_engine.ensure_engine()
    jars = kafka_broker.fetch_jars(on_progress)
    work_root = Path(prerequisites.kafka_cache_dir()).parent / "images"
    work_root.mkdir(parents=True, exist_ok=True)
    with open(work_root / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_all(source, jars, work_root, on_progress)


def _build_all(source: Path, jars: Path, work_root: Path,
               on_progress: Callable[[str], None]) -> Images:
    with tempfile.TemporaryDirectory(dir=work_root) as scratch:
        work = Path(scratch)
        base = _ensure("base", [("base", base_key().encode())], on_progress,
                       lambda ref: _build_base(ref, work))

        kafka_context = work / "kafka"
        shutil.copytree(deploy_files.root() / "docker" / "images" / "kafka", kafka_context)  # type: ignore[arg-type]
        shutil.copytree(jars, kafka_context / "libs", ignore=shutil.ignore_patterns(".*"))
        kafka = _ensure("kafka", [("base", base.encode()), *directory_parts(kafka_context)],
                        on_progress, lambda ref: _build(ref, kafka_context, base))

        s3_context = work / "s3"
        shutil.copytree(deploy_files.root() / "docker" / "images" / "s3", s3_context)  # type: ignore[arg-type]
        requirements = s3_requirements()

        def build_s3(ref: str) -> None:
            _download_wheels(requirements, s3_context / "wheels")
            _build(ref, s3_context, base, f"S3_REQUIREMENTS={' '.join(requirements)}")

        s3 = _ensure("s3", [("base", base.encode()), ("moto", " ".join(requirements).encode()),
                            *directory_parts(s3_context)], on_progress, build_s3)

        # tokenmill's dependencies in an image of their own, so a change to
        # tokenmill's code rebuilds only its wheel's layer.
        deps_context = work / "deps"
        shutil.copytree(deploy_files.root() / "docker" / "images" / "deps", deps_context)  # type: ignore[arg-type]
        pins = project_requirements(source)

        def build_deps(ref: str) -> None:
            _download_wheels(pins, deps_context / "wheels")
            (deps_context / "wheels" / "requirements.txt").write_text("\n".join(pins))
            _build(ref, deps_context, base)

        deps = _ensure("deps", [("base", base.encode()), ("requirements",
                                                           "\n".join(pins).encode()),
                                *directory_parts(deps_context)], on_progress, build_deps)

        project_context = work / "tokenmill"
        project_context.mkdir()
        dockerfile = tokenmill_dockerfile(f"tokenmill-{_version(source)}-py3-none-any.whl")
        (project_context / "Dockerfile").write_text(dockerfile)

        def build_project(ref: str) -> None:
            build_wheel(source, project_context)
            # every dependency is in the deps image: pip needs no index
            _build(ref, project_context, deps, "PIP_OPTIONS=--no-index")

        project = _ensure("tokenmill",
                          [("base", deps.encode()), ("Dockerfile", dockerfile.encode()),
                           *source_parts(source)],
                          on_progress, build_project)
    return Images(base=base, kafka=kafka, s3=s3, deps=deps, tokenmill=project)


def _version(source: Path) -> str:
    """The version pyproject.toml declares (the wheel's file name carries it)."""
    import tomllib

    return str(tomllib.loads((source / "pyproject.toml").read_text())["project"]["version"])


def _ensure(name: str, parts: list[Part], on_progress: Callable[[str], None],
            build: Callable[[str], None]) -> str:
    ref = reference(name, content_key(parts))
    if exists(ref):
        log.debug("image is cached", image=ref)
    else:
        on_progress(f"building {ref}")
        started = time.monotonic()
        build(ref)
        log.info("built image", image=ref, seconds=round(time.monotonic() - started, 1))
    _tag_local(ref)
    return ref
