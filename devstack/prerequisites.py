"""What the local stack needs from the machine (Java 17+, Maven until Kafka's
jars are cached) and what the set-up commands need (Python 3.11+ with venv),
said in one line naming everything missing.

Standard library only, and importable by an old Python (annotations are
never evaluated: `from __future__ import annotations`), so that
`python3 -m devstack.prerequisites` (run by the Makefile before it
creates the virtual environment) can tell a user with Python 3.9 what to do.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

JAVA_MIN = 17
PYTHON_MIN = (3, 11)
KAFKA_VERSION = "4.1.1"
_JAVA_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')


def java_major(version_output: str) -> int | None:
    """Java's major version from `java -version` output ("1.8.0_392" is 8)."""
    match = _JAVA_VERSION.search(version_output)
    if match is None:
        return None
    major = int(match.group(1))
    if major == 1 and match.group(2):
        return int(match.group(2))
    return major


def java_problem() -> str | None:
    java = shutil.which("java")
    if java is None:
        return (f"Java {JAVA_MIN}+ (java is not on PATH; "
                "Debian: apt-get install openjdk-17-jre-headless)")
    try:
        result = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60,
                                check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"Java {JAVA_MIN}+ ({java} -version failed: {exc})"
    major = java_major(result.stderr + result.stdout)
    if major is None or major < JAVA_MIN:
        found = f"Java {major}" if major else "an unknown Java"
        return f"Java {JAVA_MIN}+ ({java} is {found})"
    return None


def maven_problem() -> str | None:
    if shutil.which("mvn") is None:
        return ("Maven (mvn is not on PATH; it fetches Kafka's jars from Maven Central once; "
                "Debian: apt-get install maven)")
    return None


def python_problem(version: tuple[int, ...] = tuple(sys.version_info[:2])) -> str | None:
    if version < PYTHON_MIN:
        want = ".".join(map(str, PYTHON_MIN))
        have = ".".join(map(str, version))
        return (f"Python {want}+ ({sys.executable} is {have}; "
                f"pick another with `make PYTHON=python{want} ...`)")
    try:
        import ensurepip  # noqa: F401  (what `python -m venv` installs pip with)
        import venv  # noqa: F401
    except ImportError:
        return "Python's venv module (Debian: apt-get install python3-venv)"
    return None


def broker_problems(need_maven: bool) -> list[str]:
    """What the Kafka broker is missing (Maven only while jars are not cached)."""
    problems = [java_problem()]
    if need_maven:
        problems.append(maven_problem())
    return [p for p in problems if p]


def one_line(problems: list[str]) -> str:
    return "missing: " + "; ".join(problems)


def kafka_cache_dir() -> str:
    """Where Kafka's jars are fetched to once: `TOKENMILL_CACHE_DIR`, else
    `$XDG_CACHE_HOME/tokenmill`, else `~/.cache/tokenmill`."""
    root = os.environ.get("TOKENMILL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tokenmill"
    )
    return os.path.join(root, f"kafka-{KAFKA_VERSION}")


def jars_cached() -> bool:
    return os.path.isfile(os.path.join(kafka_cache_dir(), "lib", ".complete"))


def main() -> int:
    """`python -m devstack.prerequisites`: exit 1 with one line
    naming what is missing for the local stack and the set-up commands."""
    problems = [p for p in [python_problem()] if p]
    problems += broker_problems(need_maven=not jars_cached())
    if problems:
        print(one_line(problems), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
