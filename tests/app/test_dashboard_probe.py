"""The router's dashboard recognises us as a model engine: its probe, mirrored in
tests/contract/dashboard_probe.py, passes on /openapi.yaml and /openapi.json over real HTTP, and
our own name and version are still in the document."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import yaml
from contract.dashboard_probe import DOCUMENT_LIMIT, TITLE, failed_checks, failed_health, probe
from helpers import Server

from vllm_srun import __version__, defaults


@pytest.mark.parametrize("path", ["/openapi.yaml", "/openapi.json"])
def test_the_dashboard_probe_passes(start_server: Callable[..., Server], keywords: Path, path: str) -> None:
    """The probe reads /openapi.yaml (and no more than its limit of it); /openapi.json, the whole
    document, carries the same identity."""
    server = start_server(str(keywords))
    with httpx.Client(base_url=server.url, timeout=30) as client:
        assert probe(client) == []
        document = yaml.safe_load(client.get(path).text)
        health = client.get("/health").json()
    assert failed_checks(document, health) == []
    assert document["info"]["title"] == TITLE and document["info"]["version"] == health["api_version"]
    assert health["api_version"] == defaults.API_VERSION
    # Who we are is in the document still, where the probe does not look.
    assert document["info"]["x-vllm-srun"] == {
        "name": "vllm-srun",
        "version": __version__,
        "api_version": defaults.API_VERSION,
    }
    assert f"vllm-srun {__version__}" in document["info"]["description"]


def test_the_probe_refuses_what_the_dashboard_refuses() -> None:
    from vllm_srun.app.main import create_app

    document = create_app().openapi_schema.to_schema()
    health = {"api_version": defaults.API_VERSION}
    assert failed_checks(document, health) == []
    breakages = {
        "openapi": lambda d: d.update(openapi="2.0"),
        "info.title": lambda d: d["info"].update(title="vllm-srun"),
        "info.version": lambda d: d["info"].update(version="0.1.0"),
        "paths: no POST /v1/decisions": lambda d: d["paths"].pop("/v1/decisions"),
        "paths: no GET /health": lambda d: d["paths"]["/health"].pop("get"),
    }
    for field, breakage in breakages.items():
        broken = copy.deepcopy(document)
        breakage(broken)
        (failure,) = failed_checks(broken, health)
        assert failure.startswith(field), failure
    assert failed_checks(document, {"status": "ready"})[0].startswith("info.version")


def test_the_yaml_is_the_contracts_part_within_the_probes_limit() -> None:
    """/openapi.yaml holds the router contract's paths and every schema they reference, and
    fits the probe's 128 KiB; /openapi.json keeps every route."""
    from vllm_srun.app.main import create_app
    from vllm_srun.app.peers.router import CONTRACT_PATHS, openapi_yaml_text

    app = create_app()
    whole = app.openapi_schema.to_schema()
    text = openapi_yaml_text(app)
    assert len(text.encode()) <= DOCUMENT_LIMIT
    # The whole document, as /openapi.yaml answered it before, is past what the probe reads.
    assert len(yaml.safe_dump(whole).encode()) > DOCUMENT_LIMIT
    part = yaml.safe_load(text)
    assert set(part["paths"]) == set(CONTRACT_PATHS) and set(whole["paths"]) > set(CONTRACT_PATHS)
    refs = set(re.findall(r"#/components/schemas/([^'\"]+)", text))
    assert refs and refs <= set(part["components"]["schemas"]), refs - set(part["components"]["schemas"])
    for path in CONTRACT_PATHS:
        assert part["paths"][path] == whole["paths"][path], path


def test_the_probe_refuses_a_health_without_the_engines_identity() -> None:
    health = {"api_version": defaults.API_VERSION, "status": "ready", "reason": None, "model": {}}
    assert failed_health(health) == []
    assert failed_health({k: v for k, v in health.items() if k != "reason"}) == ["health.reason: missing"]
    assert failed_health({**health, "api_version": "2.3"})[0].startswith("health.api_version")
    assert failed_health({**health, "status": "up"})[0].startswith("health.status")
