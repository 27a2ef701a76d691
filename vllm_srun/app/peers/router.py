"""What the router reads of this server besides the surfaces' routes: GET /openapi.yaml, the
OpenAPI document in YAML holding only the paths of the contract it speaks (upstream's
openapi.yaml, 2.3.0, in our shapes) and the schemas they reach. The router's dashboard probes
it to tell a model engine from any other API, and reads at most 128 KiB of it, less than the
whole document with every peer's routes; /openapi.json is the whole document.
"""

from __future__ import annotations

from typing import Any

import yaml
from litestar import Request, Response, get

from vllm_srun.app.errors import UPSTREAM_PATHS

# The upstream runtime's routes: the contract's paths.
CONTRACT_PATHS = UPSTREAM_PATHS
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


# Public, as /openapi.json: the document describes the API and holds no caller's data.
@get("/openapi.yaml", summary="The OpenAPI document as YAML", include_in_schema=False, opt={"public": True})
async def openapi_yaml(request: Request[Any, Any, Any]) -> Response[str]:
    """The contract's part of /openapi.json, in YAML: where the router's dashboard probes for it."""
    return Response(openapi_yaml_text(request.app), media_type="application/yaml")
