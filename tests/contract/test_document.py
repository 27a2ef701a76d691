"""Our OpenAPI document (the one served, and the checked-in docs/openapi.json, which
tests/app/test_openapi.py keeps equal to it) describes upstream's routes with upstream's component
names, and every component it shares a name with upstream's keeps upstream's fields: each of them
present, required where upstream requires it, and of a type upstream's allows."""

from __future__ import annotations

import json
from typing import Any

import pytest
from contract import readme_table
from contract.schema import COMPONENTS
from contract.validator import ROUTES

from vllm_srun.app.openapi import document_text

# Upstream's names for bodies this server has under some name: each must be in the document.
SHARED = (
    "ClassifyResponse",
    "ClassifyResult",
    "ClassifyWindow",
    "TokenProbabilities",
    "InputUsage",
    "Span",
    "EmbeddingsResponse",
    "Embedding",
    "EmbeddingsUsage",
    "RerankResponse",
    "RerankResult",
    "DecisionResponse",
    "Answer",
    "SetAnswer",
    "Usage",
    "ResponseMeta",
    "Representation",
    "BundleResponse",
    "BundleResult",
    "ErrorResponse",
    "ModelList",
    "ModelCard",
    "Health",
    "Liveness",
)
# The names these bodies had before they took upstream's.
RETIRED = ("InputInfo", "EmbeddingData", "DecisionsResponse", "DecisionAnswer")


@pytest.fixture(scope="module")
def schemas() -> dict[str, Any]:
    doc = json.loads(document_text())
    return {"paths": doc["paths"], **doc["components"]["schemas"]}


def _ok_schema(paths: dict[str, Any], method: str, path: str, status: str = "200") -> Any:
    response = paths[path][method.lower()]["responses"][status]
    return response["content"]["application/json"]["schema"]


def test_upstream_routes_answer_upstream_components(schemas: dict[str, Any]) -> None:
    wrong = {}
    for (method, path), (component, errors) in ROUTES.items():
        if path not in schemas["paths"]:
            wrong[f"{method} {path}"] = "missing from the document"
            continue
        expected = {"$ref": f"#/components/schemas/{component}"}
        if _ok_schema(schemas["paths"], method, path) != expected:
            wrong[f"{method} {path} 200"] = _ok_schema(schemas["paths"], method, path)
        for status in errors:
            if _ok_schema(schemas["paths"], method, path, str(status)) != {
                "$ref": "#/components/schemas/ErrorResponse"
            }:
                wrong[f"{method} {path} {status}"] = "not ErrorResponse"
    assert not wrong, wrong


def test_document_uses_upstream_names(schemas: dict[str, Any]) -> None:
    assert [n for n in SHARED if n not in schemas] == []
    assert [n for n in RETIRED if n in schemas] == []


def _types(schema: Any, schemas: dict[str, Any]) -> set[str] | None:
    """The JSON types a (document or upstream) schema allows; None when it does not say."""
    if not isinstance(schema, dict):
        return None
    if "$ref" in schema:
        target = schemas.get(schema["$ref"].rsplit("/", 1)[-1])
        return _types(target, schemas) if target is not None else {"object"}
    if "type" in schema:
        kinds = schema["type"]
        return set(kinds) if isinstance(kinds, list) else {kinds}
    members = schema.get("anyOf") or schema.get("oneOf")
    if members:
        out: set[str] = set()
        for member in members:
            kinds = _types(member, schemas)
            if kinds is None:
                return None
            out |= kinds
        return out
    return None


def _enum(schema: Any, schemas: dict[str, Any]) -> set[Any] | None:
    if not isinstance(schema, dict):
        return None
    if "$ref" in schema:
        return _enum(schemas.get(schema["$ref"].rsplit("/", 1)[-1]), schemas)
    if "enum" in schema:
        return set(schema["enum"])
    members = schema.get("anyOf") or schema.get("oneOf")
    if members:
        values = [_enum(m, schemas) for m in members if _types(m, schemas) != {"null"}]
        if values and all(v is not None for v in values):
            return set().union(*values)  # type: ignore[arg-type]
    return None


def test_shared_components_keep_upstream_fields(schemas: dict[str, Any]) -> None:
    """Where ours and upstream's share a name, ours adds, never changes: upstream's properties are
    all there (but those docs/router.md's table says are absent, and why), its required ones required, each typed within upstream's types (an integer where
    upstream says number; null ignored: the server omits a field it has no value for), and an
    enum of ours within upstream's."""
    problems, absent = [], readme_table.absent()
    for name, upstream in COMPONENTS.items():
        ours = schemas.get(name)
        if ours is None or "properties" not in upstream:
            continue
        properties = ours.get("properties", {})
        missing = set(upstream["properties"]) - set(properties) - {f for c, f in absent if c == name}
        problems += [f"{name}.{field}: missing" for field in sorted(missing)]
        optional = set(upstream.get("required", [])) - set(ours.get("required", []))
        problems += [f"{name}.{field}: upstream requires it" for field in sorted(optional - missing)]
        for field, theirs in upstream["properties"].items():
            if field not in properties:
                continue
            allowed, sent = _types(theirs, COMPONENTS), _types(properties[field], schemas)
            if allowed is not None and sent is not None:
                allowed = allowed | ({"integer"} if "number" in allowed else set())
                if sent - {"null"} - allowed:
                    problems.append(f"{name}.{field}: {sorted(sent)} where upstream allows {sorted(allowed)}")
            their_enum, our_enum = _enum(theirs, COMPONENTS), _enum(properties[field], schemas)
            if their_enum is not None and our_enum is not None and our_enum - their_enum - {None}:
                problems.append(
                    f"{name}.{field}: values {sorted(map(str, our_enum - their_enum))} are not upstream's"
                )
    assert not problems, "\n".join(problems)
