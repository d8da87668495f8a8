"""Install like a user: the wheel, built from this checkout, installed into a
fresh virtual environment outside it (no PYTHONPATH, no editable install,
another working directory), runs `tokenmill demo` to completion, and the
demo's S3 objects plus dead-letter records are exactly the published prompts.

The environment is a clean `python -m venv` (no system site-packages). The
installer is uv (`uv pip install`, which `make test` puts beside pytest), else
pip: either resolves and installs every dependency the wheel declares, and
nothing else; uv does it in under a second of CPU where pip took 20 s (moto's
dependencies), on a CI that waits on CPU.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections import Counter
from pathlib import Path

import msgspec
import pytest

from devstack.images import NOT_SOURCE_PATTERNS
from tests.kafka_helpers import read_all
from tokenmill.kafka import topics

pytestmark = [pytest.mark.slow, pytest.mark.broker]

CHECKOUT = Path(__file__).resolve().parents[2]
TEST_ONLY = {"moto", "kafka-python", "pytest", "pytest-asyncio", "pytest-timeout", "hypothesis",
             "testcontainers", "openai", "pyarrow", "lz4", "pyyaml"}


def _user_env(**extra: str) -> dict[str, str]:
    """The environment of a user's shell: nothing pointing at this checkout."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
           and not k.startswith(("TOKENMILL_", "AWS_"))}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.update(extra)
    return env


UV = Path(sys.executable).parent / "uv"  # beside pytest's interpreter, or absent


def _pip(python: Path, *args: str | Path) -> list[str | Path]:
    """`pip <args>` on the environment of `python`: uv's pip interface when
    uv sits beside this interpreter, else the environment's own pip."""
    if UV.is_file():
        return [UV, "pip", *args, "--python", python]
    return [python, "-m", "pip", *args]


def _installed(python: Path, cwd: Path) -> set[str]:
    listed = _run(_pip(python, "list", "--format=json"), cwd=cwd)
    assert listed.returncode == 0, listed.stderr
    return {p["name"].lower().replace("_", "-") for p in json.loads(listed.stdout)}


def _run(args: list[str | Path], cwd: Path, timeout: float = 600,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env or _user_env())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel as a release would build it: from a copy of the source (so no
    stale build/ of the checkout leaks in), with pip's build isolation."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    shutil.copytree(CHECKOUT, source, ignore=shutil.ignore_patterns(*NOT_SOURCE_PATTERNS))
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", work / "dist",
                  source], cwd=work)
    assert built.returncode == 0, built.stderr[-3000:]
    (found,) = (work / "dist").glob("tokenmill-*.whl")
    return found


def _requirements(metadata: str) -> tuple[set[str], dict[str, set[str]]]:
    """(names required without extras, names required per extra)."""
    base: set[str] = set()
    extras: dict[str, set[str]] = {}
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        requirement = line.split(":", 1)[1].strip()
        name = re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")
        extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", requirement)
        if extra:
            extras.setdefault(extra.group(1), set()).add(name)
        else:
            base.add(name)
    return base, extras


def test_wheel_metadata_keeps_the_runtime_lean(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        (metadata_name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        base, extras = _requirements(archive.read(metadata_name).decode())
        names = set(archive.namelist())
    assert {"confluent-kafka", "aiohttp", "boto3", "msgspec"} <= base
    assert not base & TEST_ONLY, f"runtime requires {base & TEST_ONLY}"
    assert "moto" in extras["local"]
    assert {"kafka-python", "pytest", "tokenmill"} <= extras["test"]
    # Everything the commands read at run time is in the wheel.
    # deploy/ and docker/ ship inside the package (pyproject's package-dir).
    wheel_path = {"deploy": "tokenmill/deploy", "docker": "tokenmill/docker",
                  "devstack/sample": "devstack/sample"}
    shipped = {f"{inside}/{p.relative_to(CHECKOUT / folder)}"
               for folder, inside in wheel_path.items()
               for p in (CHECKOUT / folder).rglob("*")
               if p.is_file() and "__pycache__" not in p.parts}
    assert shipped and shipped <= names, shipped - names
    assert not any(n.startswith("tests/") for n in names)


def test_installed_wheel_runs_the_demo_anywhere(wheel: Path, tmp_path: Path) -> None:
    venv, home = tmp_path / "venv", tmp_path / "elsewhere"
    home.mkdir()
    without_pip = ["--without-pip"] if UV.is_file() else []  # uv installs from outside
    created = _run([sys.executable, "-m", "venv", *without_pip, venv], cwd=home)
    assert created.returncode == 0, created.stderr
    python, tokenmill = venv / "bin" / "python", venv / "bin" / "tokenmill"

    # `pip install tokenmill`: the runtime only.
    plain = _run(_pip(python, "install", "-q", wheel), cwd=home)
    assert plain.returncode == 0, plain.stderr[-3000:]
    installed = _installed(python, home)
    assert "tokenmill" in installed and not installed & TEST_ONLY, installed & TEST_ONLY
    where = _run([python, "-c", "import tokenmill; print(tokenmill.__file__)"], cwd=home)
    assert where.stdout.strip().startswith(str(venv)), where.stdout

    # Without the `local` extra the local stack says, in one line, what to install.
    bare = _run([tokenmill, "dev", "up", "--state-dir", home / "state"], cwd=home, timeout=120)
    assert bare.returncode == 1
    assert "Traceback" not in bare.stderr
    message = " ".join(bare.stderr.split())
    assert "pip install 'tokenmill[local]'" in message, bare.stderr

    local = _run(_pip(python, "install", "-q", f"{wheel}[local]"), cwd=home)
    assert local.returncode == 0, local.stderr[-3000:]

    state = home / "state"
    run = "wheel-demo"
    demo = _run([tokenmill, "demo", "--run", run, "--state-dir", state, "--keep",
                 "--timeout", "500"], cwd=home, timeout=600)
    stack_dir = state / "demo" / "stack"
    try:
        assert demo.returncode == 0, demo.stderr[-4000:]
        saved = msgspec.json.decode((stack_dir / "stack.json").read_bytes())
        bootstrap = ",".join(b["address"] for b in saved["brokers"])
        published = [json.loads(r.value)["id"]
                     for r in read_all(bootstrap, topics.prompts_topic(run))]
    finally:
        down = _run([tokenmill, "dev", "down", "--state-dir", stack_dir], cwd=home, timeout=120)
    assert down.returncode == 0, down.stderr

    output = state / "demo" / "output" / run
    in_s3 = [json.loads(line)["id"] for path in sorted((output / "s3").rglob("*.jsonl"))
             for line in path.read_text().splitlines() if line.strip()]
    in_dlq = [json.loads(line)["id"] for line in (output / "dlq.jsonl").read_text().splitlines()
              if line.strip()]
    assert len(published) > 200 and len(set(published)) == len(published)
    assert in_s3 and in_dlq
    persisted = Counter(in_s3 + in_dlq)
    assert [i for i, n in persisted.items() if n > 1] == []  # nothing twice
    assert set(persisted) == set(published)  # nothing lost, nothing extra
    charts = json.loads((output / "report" / "report.json").read_text())  # `tokenmill report`
    assert charts["records"] == len(published) and (output / "report" / "report.html").is_file()
    summary = " ".join(demo.stdout.split())
    assert f"prompts published │ {len(published):,} │" in summary
    assert "0 (S3 + DLQ = published)" in summary
