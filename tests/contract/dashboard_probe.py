"""The router dashboard's serving-mode probe (semantic-router, dashboard/backend/handlers,
`probeServingHealth` and `isModelEngineAPI`), check by check: it reads GET /health, then at most
128 KiB of GET /openapi.yaml, and calls the server a model engine only when every one holds. Each failed check is returned by the name of its field."""

from __future__ import annotations

import re
from typing import Any

import httpx
import yaml

TITLE = "vLLM Semantic Router Model Runtime"
OPERATIONS = (("get", "/health"), ("get", "/v1/models"), ("post", "/v1/decisions"))
# What it reads at most of each (servingHealthLimit, servingOpenAPILimit): a longer body fails.
HEALTH_LIMIT = 64 << 10
DOCUMENT_LIMIT = 128 << 10
STATES = ("starting", "loading", "warming", "ready", "failed", "degraded")
API_VERSION = re.compile(r"^\d+\.\d+\.\d+$")


def failed_health(health: Any) -> list[str]:
    """What the probe refuses in the body of GET /health before it reads the document."""
    if not isinstance(health, dict):
        return ["health: not a mapping"]
    failed = []
    if not API_VERSION.match(str(health.get("api_version", ""))):
        failed.append(f"health.api_version: {health.get('api_version')!r} is not MAJOR.MINOR.PATCH")
    # Present, null included (Go's json.RawMessage of null is not empty); absent fails.
    failed += [f"health.{field}: missing" for field in ("reason", "model") if field not in health]
    if health.get("status") not in STATES:
        failed.append(f"health.status: {health.get('status')!r} is not one of {', '.join(STATES)}")
    return failed


def failed_checks(document: Any, health: Any) -> list[str]:
    """What the probe refuses in `document`, given the body of GET /health."""
    if not isinstance(document, dict):
        return ["document: not a mapping"]
    info = document.get("info") if isinstance(document.get("info"), dict) else {}
    paths = document.get("paths") if isinstance(document.get("paths"), dict) else {}
    failed = []
    if not str(document.get("openapi", "")).startswith("3."):
        failed.append(f"openapi: {document.get('openapi')!r} does not start with 3.")
    if info.get("title") != TITLE:
        failed.append(f"info.title: {info.get('title')!r} is not {TITLE!r}")
    api_version = health.get("api_version") if isinstance(health, dict) else None
    if not api_version or info.get("version") != api_version:
        failed.append(f"info.version: {info.get('version')!r} is not /health's api_version {api_version!r}")
    for method, path in OPERATIONS:
        if not isinstance(paths.get(path), dict) or method not in paths[path]:
            failed.append(f"paths: no {method.upper()} {path}")
    return failed


def probe(client: httpx.Client) -> list[str]:
    """The probe over HTTP, as the dashboard makes it: GET /health, then GET /openapi.yaml."""
    health = client.get("/health")
    if len(health.content) > HEALTH_LIMIT:
        return [f"/health: {len(health.content)} bytes, over {HEALTH_LIMIT}"]
    failed = failed_health(health.json())
    if failed:
        return failed
    answered = client.get("/openapi.yaml")
    if answered.status_code != 200:
        return [f"/openapi.yaml: status {answered.status_code}"]
    if len(answered.content) > DOCUMENT_LIMIT:
        return [f"/openapi.yaml: {len(answered.content)} bytes, over {DOCUMENT_LIMIT}"]
    return failed_checks(yaml.safe_load(answered.text), health.json())
