"""Tiny HTTP helpers for the simulator tests (real HTTP through urllib, no mocks)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


def http(method: str, url: str, body: Any = None, timeout: float = 30) -> tuple[int, Any]:
    """(status, decoded JSON or text or None) of one request."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw, ctype = resp.status, resp.read(), resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        status, raw, ctype = exc.code, exc.read(), exc.headers.get("Content-Type", "")
    if not raw:
        return status, None
    return status, json.loads(raw) if "json" in ctype else raw.decode()


def chat(url: str, body: dict[str, Any], timeout: float = 30) -> tuple[int, Any]:
    return http("POST", url + "/v1/chat/completions", body, timeout)


def user(text: str, **extra: Any) -> dict[str, Any]:
    """A one-message chat body."""
    return {"model": "m", "messages": [{"role": "user", "content": text}], **extra}


def metric_values(url: str) -> dict[str, float]:
    """Samples of /metrics by name (labels dropped; one series per name here)."""
    from prometheus_client.parser import text_string_to_metric_families

    _, text = http("GET", url + "/metrics")
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = sample.value
    return out
