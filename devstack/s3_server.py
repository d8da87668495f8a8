"""An S3 API server for local runs and tests: moto in server mode (the
`local` extra). It keeps objects in memory: they last as long as it runs."""

from __future__ import annotations

import sys

# moto accepts any credentials; these are what `dev env` exports.
DEV_ACCESS_KEY = "tokenmill-dev"
DEV_SECRET_KEY = "tokenmill-dev-secret"


def command(host: str, port: int) -> list[str]:
    return [sys.executable, "-m", "moto.server", "-H", host, "-p", str(port)]
