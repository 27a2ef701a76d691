"""The router dashboard's serving-mode probe (semantic-router, dashboard/backend/handlers,
`isModelEngineAPI`), check by check: it reads GET /openapi.yaml and calls the server a model
engine only when every one holds. Each failed check is returned by the name of its field."""

from __future__ import annotations

from typing import Any

import httpx
import yaml

TITLE = "vLLM Semantic Router Model Runtime"
OPERATIONS = (("get", "/health"), ("get", "/v1/models"), ("post", "/v1/decisions"))


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


def probe(client: httpx.Client, path: str = "/openapi.yaml") -> list[str]:
    """The probe over HTTP: the document at `path` (YAML, or JSON, which YAML reads too) and /health."""
    answered = client.get(path)
    if answered.status_code != 200:
        return [f"{path}: status {answered.status_code}"]
    health = client.get("/health")
    return failed_checks(yaml.safe_load(answered.text), health.json())
