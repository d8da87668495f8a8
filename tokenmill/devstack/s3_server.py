"""An S3 API server for local runs and tests: moto in server mode."""

from __future__ import annotations

import sys
from pathlib import Path

from tokenmill.devstack import processes

# moto accepts any credentials; these are what `dev env` exports.
DEV_ACCESS_KEY = "tokenmill-dev"
DEV_SECRET_KEY = "tokenmill-dev-secret"


def start(host: str, port: int, logs_dir: Path) -> int:
    return processes.spawn(
        [sys.executable, "-m", "moto.server", "-H", host, "-p", str(port)],
        logs_dir / "s3.out",
    )
