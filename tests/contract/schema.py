"""The response bodies of the upstream runtime's contract, as JSON Schema (draft 2020-12).

Source: vllm-project/semantic-router, `src/model-runtime/vllm_srun/api/openapi.yaml`, info.version
2.3.0 — the document the router's Go client is generated from. Written here from reading it, one
entry per component, under upstream's component names, so a violation names the component a
generated client would fail to decode.

Every response object is open (`additionalProperties` is left unset): that is how this server adds
fields (`meta.cache`, jobs, OpenAI's `prompt_tokens`...). What a schema does fix is what a
generated client reads: the required fields, their types, their enums and where null is allowed.
Request bodies are not described: the server validates those against its own types.
"""

from __future__ import annotations

from typing import Any

API_VERSION = "2.3.0"

Schema = dict[str, Any]

# Upstream's enums, each named after the component or field that defines it.
ITEM_ERROR = [
    "invalid_question",
    "invalid_input",
    "max_length_exceeded",
    "scan_budget_exceeded",
    "invalid_model_output",
    "deadline_exceeded",
    "unavailable",
]
ERROR_CODE = [
    "invalid_request",
    "model_not_found",
    "request_too_large",
    "unsupported_surface",
    "overloaded",
    "internal_error",
    "not_ready",
]
MODEL_STATUS = ["starting", "loading", "warming", "ready", "degraded", "failed"]
HEAD_KIND = ["sequence", "scores", "token"]
SERVER_TIMING_PHASES = ("parse", "tokenize", "queue", "forward", "post", "serialize", "total")


def ref(name: str) -> Schema:
    return {"$ref": f"#/$defs/{name}"}


def obj(required: tuple[str, ...] = (), **properties: Schema) -> Schema:
    """An open object: `required` must be present, listed properties must match when present."""
    schema: Schema = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    return schema


def array(items: Schema) -> Schema:
    return {"type": "array", "items": items}


def nullable(schema: Schema) -> Schema:
    """OpenAPI 3.0's `nullable: true`: the schema, or null (an enum gains null too)."""
    out = dict(schema)
    kind = out.get("type")
    if isinstance(kind, str):
        out["type"] = [kind, "null"]
    if "enum" in out:
        out["enum"] = [*out["enum"], None]
    return out


def mapping(values: Schema) -> Schema:
    """An object keyed by names (question IDs, labels, model names) with values of one schema."""
    return {"type": "object", "additionalProperties": values}


STRING: Schema = {"type": "string"}
INTEGER: Schema = {"type": "integer"}
NUMBER: Schema = {"type": "number"}
BOOLEAN: Schema = {"type": "boolean"}
STRINGS = array(STRING)
NUMBERS = array(NUMBER)
INTEGERS = array(INTEGER)
COVERAGE: Schema = {"type": "string", "enum": ["complete"]}
# Base64Vector (`format: byte`): standard base64, padded.
BASE64: Schema = {
    "type": "string",
    "pattern": r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$",
}

_DECISION_FIELDS: dict[str, Schema] = {
    "model": STRING,
    "answers": mapping(ref("Answer")),
    "spans": mapping(array(ref("Span"))),
    "sets": mapping(ref("SetAnswer")),
    "thresholds": mapping(NUMBER),
    "span_heads": mapping(STRING),
    "usage": ref("Usage"),
    "meta": ref("ResponseMeta"),
}

COMPONENTS: dict[str, Schema] = {
    # /v1/decisions and /v1/systemone
    "DecisionResponse": obj(
        ("model", "answers", "usage"), **_DECISION_FIELDS, states=mapping(ref("DecisionStateResponse"))
    ),
    "DecisionStateResponse": obj(("model", "answers", "usage"), **_DECISION_FIELDS),
    "Answer": obj(
        ("type",),
        input_coverage=COVERAGE,
        type=nullable(STRING),
        choice=STRING,
        noul=NUMBER,
        score=NUMBER,
        probabilities=mapping(NUMBER),
        confidence=NUMBER,
        abstain_probability=NUMBER,
        legend=mapping(STRING),
        error=ref("ItemError"),
        message=STRING,
    ),
    "ItemError": {"type": "string", "enum": ITEM_ERROR},
    "Span": obj(
        ("label", "start", "end", "text", "probability"),
        label=STRING,
        start=INTEGER,
        end=INTEGER,
        text=STRING,
        probability=NUMBER,
    ),
    "SetAnswer": obj(
        ("selected", "probabilities"),
        input_coverage=COVERAGE,
        selected=STRINGS,
        probabilities=mapping(NUMBER),
    ),
    "Usage": obj(("input_tokens", "output_tokens"), input_tokens=INTEGER, output_tokens=INTEGER),
    "ResponseMeta": obj(
        model_id=STRING,
        revision=nullable(STRING),
        model_sha256=STRING,
        profile=STRING,
        numerics=STRING,
        engine=STRING,
        accelerator=STRING,
        device=STRING,
        queue_ms=NUMBER,
        compute_ms=NUMBER,
        head=STRING,
        representation=ref("Representation"),
    ),
    "Representation": obj(
        ("model_sha256", "layer", "dimension"),
        model_sha256=STRING,
        layer=INTEGER,
        dimension=INTEGER,
        normalized=BOOLEAN,
        modality=STRING,
    ),
    # /v1/classify
    "ClassifyResponse": obj(
        ("model", "head", "kind", "labels", "results", "usage"),
        model=STRING,
        head=STRING,
        kind={"type": "string", "enum": HEAD_KIND},
        labels=STRINGS,
        results=array(ref("ClassifyResult")),
        usage=ref("Usage"),
        meta=ref("ResponseMeta"),
    ),
    "ClassifyResult": obj(
        ("index",),
        index=INTEGER,
        label=STRING,
        probabilities=NUMBERS,
        scores=NUMBERS,
        selected=STRINGS,
        spans=array(ref("Span")),
        tokens=array(ref("TokenProbabilities")),
        windows=array(ref("ClassifyWindow")),
        input=ref("InputUsage"),
        error=ref("ItemError"),
    ),
    "ClassifyWindow": obj(
        ("start", "end"), start=INTEGER, end=INTEGER, probabilities=NUMBERS, scores=NUMBERS
    ),
    "TokenProbabilities": obj(
        ("start", "end", "probabilities"), start=INTEGER, end=INTEGER, probabilities=NUMBERS
    ),
    "InputUsage": obj(
        ("tokens", "processed_tokens", "truncated"),
        tokens=INTEGER,
        processed_tokens=INTEGER,
        truncated=BOOLEAN,
        tokens_lower_bound=BOOLEAN,
        windows=INTEGER,
    ),
    # /v1/embeddings
    "EmbeddingsResponse": obj(
        ("object", "data", "model", "usage"),
        object=STRING,
        data=array(ref("Embedding")),
        model=STRING,
        usage=ref("EmbeddingsUsage"),
        meta=ref("ResponseMeta"),
    ),
    "Embedding": obj(
        ("object", "index"),
        object=STRING,
        index=INTEGER,
        embedding=ref("EmbeddingVector"),
        input=ref("InputUsage"),
        error=ref("ItemError"),
    ),
    "EmbeddingVector": {"oneOf": [NUMBERS, BASE64]},
    "EmbeddingsUsage": obj(("prompt_tokens", "total_tokens"), prompt_tokens=INTEGER, total_tokens=INTEGER),
    # /v1/rerank
    "RerankResponse": obj(
        ("model", "results", "usage"),
        model=STRING,
        results=array(ref("RerankResult")),
        usage=ref("Usage"),
        meta=ref("ResponseMeta"),
    ),
    "RerankResult": obj(
        ("index",),
        index=INTEGER,
        relevance_score=NUMBER,
        logit=NUMBER,
        document=STRING,
        input=ref("InputUsage"),
        error=ref("ItemError"),
    ),
    # /v1/bundle
    "BundleResponse": obj(("results",), results=array(ref("BundleResult"))),
    "BundleResult": obj(
        ("id", "status"),
        id=STRING,
        status=INTEGER,
        decisions=ref("DecisionResponse"),
        classify=ref("ClassifyResponse"),
        embeddings=ref("EmbeddingsResponse"),
        rerank=ref("RerankResponse"),
        error=ref("ErrorBody"),
    ),
    # Every request-level error
    "ErrorResponse": obj(("error",), error=ref("ErrorBody")),
    "ErrorBody": obj(("code", "message"), code={"type": "string", "enum": ERROR_CODE}, message=STRING),
    # /v1/models
    "ModelList": obj(
        ("object", "data", "api_version", "limits"),
        api_version=STRING,
        object=STRING,
        data=array(ref("ModelCard")),
        limits=ref("ProcessLimits"),
    ),
    "ProcessLimits": obj(
        ("max_bundle_tasks", "max_request_bytes"),
        max_bundle_tasks={"type": "integer", "minimum": 1},
        max_request_bytes={"type": "integer", "minimum": 1},
    ),
    "ModelCard": obj(
        ("id", "object", "family", "surfaces", "ready"),
        id=STRING,
        object=STRING,
        owned_by=STRING,
        family=STRING,
        repo=nullable(STRING),
        revision=nullable(STRING),
        model_sha256=STRING,
        manifest_sha256=STRING,
        surfaces=STRINGS,
        question_types=STRINGS,
        presets=STRINGS,
        modalities=STRINGS,
        heads=array(ref("HeadCard")),
        embedding=ref("EmbeddingCard"),
        rerank=ref("RerankCard"),
        limits=ref("ModelLimits"),
        licence=nullable(STRING),
        profile=STRING,
        profiles=array(ref("ProfileInfo")),
        engine=STRING,
        accelerator=STRING,
        accelerator_validated=BOOLEAN,
        device=STRING,
        dtype=STRING,
        parameters=INTEGER,
        ready=BOOLEAN,
        status={"type": "string", "enum": MODEL_STATUS},
        reason=nullable(STRING),
        golden=ref("GoldenStatus"),
        plugins=array(ref("PluginInfo")),
    ),
    "HeadCard": obj(
        ("name", "kind", "labels"),
        name=STRING,
        kind={"type": "string", "enum": HEAD_KIND},
        labels=STRINGS,
        inputs=STRINGS,
        default_threshold=nullable(NUMBER),
        thresholds=nullable(NUMBERS),
        overflow={"type": "string", "enum": ["reject", "truncate", "window"]},
        window=ref("HeadWindow"),
        reduction=nullable({"type": "string", "enum": ["max", "span_union"]}),
        operating_point_sha256=nullable({"type": "string", "pattern": "^[0-9a-f]{64}$"}),
    ),
    "HeadWindow": nullable(obj(("tokens", "overlap"), tokens=INTEGER, overlap=INTEGER)),
    "EmbeddingCard": obj(
        ("dimensions", "layers", "modalities", "normalized", "pooling", "input_types"),
        dimensions=INTEGERS,
        layers=INTEGERS,
        modalities=STRINGS,
        normalized=BOOLEAN,
        pooling=STRING,
        input_types=STRINGS,
    ),
    "RerankCard": obj(("exits", "default"), exits=array(ref("RerankExit")), default=ref("RerankExit")),
    "RerankExit": obj(("layer", "dimension"), layer=INTEGER, dimension=INTEGER),
    "ModelLimits": obj(
        max_input_tokens=INTEGER,
        max_scan_tokens=INTEGER,
        truncate_tokens=INTEGER,
        min_options=INTEGER,
        max_options=INTEGER,
        min_levels=INTEGER,
        max_levels=INTEGER,
        max_inputs=INTEGER,
        image_max_pixels=INTEGER,
        image_source_max_pixels=INTEGER,
        image_max_bytes=INTEGER,
    ),
    "ProfileInfo": obj(
        ("name", "numerics"),
        name=STRING,
        numerics={"type": "string", "enum": ["exact", "approximate"]},
        description=STRING,
    ),
    "GoldenStatus": obj(
        ("status",),
        status={"type": "string", "enum": ["pending", "matched", "unverified", "failed"]},
        checked=INTEGER,
        matched=INTEGER,
        reference=nullable(STRING),
    ),
    "PluginInfo": obj(
        ("group", "name"),
        group=STRING,
        name=STRING,
        distribution=nullable(STRING),
        version=nullable(STRING),
        capabilities={"type": "object"},
    ),
    # /health and /health/live
    "Health": obj(
        ("status", "api_version"),
        api_version=STRING,
        status={"type": "string", "enum": MODEL_STATUS},
        reason=nullable(STRING),
        model=nullable(STRING),
        models=mapping(ref("ModelHealth")),
    ),
    "ModelHealth": obj(("status",), status={"type": "string", "enum": MODEL_STATUS}, reason=nullable(STRING)),
    "Liveness": obj(
        ("status", "api_version"), api_version=STRING, status={"type": "string", "enum": ["alive"]}
    ),
}


def document(component: str) -> Schema:
    """A standalone schema for one component, with every component it refers to."""
    if component not in COMPONENTS:
        raise KeyError(f"no upstream component {component!r}; known: {', '.join(sorted(COMPONENTS))}")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$defs": COMPONENTS, **ref(component)}
