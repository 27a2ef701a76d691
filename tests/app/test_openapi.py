"""The checked-in OpenAPI document matches what the app serves."""

from __future__ import annotations

from helpers import REPO

from vllm_srun.app.openapi import document_text


def test_checked_in_copy_is_in_sync() -> None:
    checked_in = (REPO / "docs" / "openapi.json").read_text()
    assert checked_in == document_text(), "regenerate: python -m vllm_srun.app.openapi > docs/openapi.json"


def test_document_describes_every_surface() -> None:
    import json

    doc = json.loads(document_text())
    for path in ("/v1/classify", "/v1/embeddings", "/v1/rerank", "/v1/models", "/health", "/metrics"):
        assert path in doc["paths"], path
    schemas = doc["components"]["schemas"]
    assert "ClassifyRequest" in schemas and "EmbeddingsResponse" in schemas
