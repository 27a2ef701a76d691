"""The OpenAPI document in YAML, as GET /openapi.yaml answers it: the router contract's part.

The router's dashboard reads /openapi.yaml to tell a model engine from any other API, and reads
at most 128 KiB of it (semantic-router, dashboard/backend/handlers, `servingOpenAPILimit`); the
whole document, with every peer's routes (TEI, vLLM, Infinity, Cohere), is larger. So the YAML
holds the paths of the contract the router speaks (upstream's openapi.yaml, 2.3.0, in our
shapes) with the schemas they reference; /openapi.json is the whole document.
"""

from __future__ import annotations

from typing import Any

import yaml

CONTRACT_PATHS = (
    "/health",
    "/health/live",
    "/metrics",
    "/v1/models",
    "/v1/classify",
    "/v1/embeddings",
    "/v1/rerank",
    "/v1/decisions",
    "/v1/bundle",
    "/v1/systemone",
)
_SCHEMAS = "#/components/schemas/"


class _Dumper(yaml.SafeDumper):
    """YAML without anchors: a schema that appears twice is written out twice, as in JSON."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def contract_document(document: dict[str, Any]) -> dict[str, Any]:
    """`document` with only CONTRACT_PATHS and the component schemas they reach."""
    paths = {path: item for path, item in document["paths"].items() if path in CONTRACT_PATHS}
    schemas = document.get("components", {}).get("schemas", {})
    reached: set[str] = set()
    pending: list[Any] = [paths]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith(_SCHEMAS) and ref[len(_SCHEMAS) :] not in reached:
                reached.add(ref[len(_SCHEMAS) :])
                pending.append(schemas.get(ref[len(_SCHEMAS) :]))
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
    components = {
        **document.get("components", {}),
        "schemas": {n: s for n, s in schemas.items() if n in reached},
    }
    return {**document, "paths": paths, "components": components}


def openapi_yaml_text(app: Any) -> str:
    """`app`'s contract document (`contract_document`) in YAML, keys in the JSON document's order."""
    document = contract_document(app.openapi_schema.to_schema())
    return yaml.dump(document, Dumper=_Dumper, sort_keys=False, allow_unicode=True)
