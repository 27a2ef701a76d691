"""The checked-in OpenAPI document matches what the app serves."""

from __future__ import annotations

import re

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


def test_question_types_agree_with_the_parser() -> None:
    """The document's question types (decision_surface.QuestionBody) accept what
    parse_question accepts and refuse what it refuses, on each kind of question."""
    import msgspec
    import pytest

    from vllm_srun.plugins.decision_bodies import QuestionBody, QuestionInvalid, parse_question

    accepted = [
        {"type": "choice", "instructions": "Topic?", "criteria": {"a": "about A", "b": "about B"}},
        {
            "type": "choice",
            "instructions": "Topic?",
            "choices": [{"key": "a", "description": "A"}, {"key": "b", "description": "B"}],
        },
        {"type": "noul", "instructions": "Is it polite?"},
        {"type": "noul", "instructions": "Is it polite?", "criteria": {"true": "polite"}},
        {"type": "score", "instructions": "How polite?", "levels": ["rude", "neutral", "polite"]},
    ]
    refused = [
        {"type": "score", "instructions": "How polite?", "levels": ["only one"]},
        {"type": "noul", "instructions": "Is it polite?", "criteria": None},
        {"type": "noul", "instructions": "   "},
        {"type": "noul", "instructions": "Is it polite?", "levels": ["a", "b"]},
        {"type": "choice", "instructions": "Topic?", "criteria": {"a": "only one"}},
        {"type": "ask", "instructions": "Topic?"},
    ]
    for raw in accepted:
        msgspec.convert(raw, QuestionBody)
        parse_question("q", raw, "questions.q")
    for raw in refused:
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert(raw, QuestionBody)
        with pytest.raises(QuestionInvalid):
            parse_question("q", raw, "questions.q")


def test_document_types_questions_and_job_bodies() -> None:
    import json

    doc = json.loads(document_text())
    questions = doc["components"]["schemas"]["DecisionRequest"]["properties"]["questions"]
    # One of: a typed question (its `type` and `instructions`) or a preset (neither), never two.
    kinds = [q["properties"]["type"]["enum"] for q in questions["additionalProperties"]["oneOf"]]
    assert kinds == [["choice"], ["noul"], ["score"], ["set"], ["choice", "noul", "score", "set", "span"]]
    assert "preset" in questions["additionalProperties"]["oneOf"][-1]["required"]
    create = doc["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]
    assert create["application/json"]["schema"]["required"] == ["surface", "requests"]
    assert "application/x-ndjson" in create
    error = doc["paths"]["/v1/classify"]["post"]["responses"]["404"]["content"]["application/json"]["schema"]
    assert error == {"$ref": "#/components/schemas/ErrorResponse"}
    assert "text/plain" in doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]


def test_every_reference_resolves() -> None:
    """Schemas written by msgspec refer to components by class name, as Litestar names them."""
    import json

    text = document_text()
    components = json.loads(text)["components"]["schemas"]
    refs = set(re.findall(r'"\$ref": "#/components/schemas/([^"]+)"', text))
    assert refs and refs <= set(components), refs - set(components)


def test_document_states_what_the_routes_check_themselves() -> None:
    """Bounds a route checks itself, after decoding, are in the document too: a client built
    from it never sends an empty TEI batch or a bundle task with no surface or two."""
    import json

    doc = json.loads(document_text())
    schemas = doc["components"]["schemas"]
    assert schemas["BundleTask"]["oneOf"] == [
        {"required": [name]} for name in ("decisions", "classify", "embeddings", "rerank")
    ]
    assert schemas["RerankBody"]["properties"]["texts"]["minItems"] == 1
    assert schemas["RerankBody"]["oneOf"] == [{"required": ["texts"]}, {"required": ["documents"]}]
    assert schemas["DecodeRequest"]["properties"]["ids"]["minItems"] == 1
    embed = schemas["EmbedRequest"]["properties"]["inputs"]["anyOf"]
    assert {"minLength": 1, "type": "string"} in embed and any(s.get("minItems") == 1 for s in embed)
    events = doc["paths"]["/v1/jobs/{job_id}/events"]["get"]["responses"]["200"]["content"]
    assert list(events) == ["text/event-stream"]


def test_every_operation_is_listed_once_under_its_tag() -> None:
    """The reference groups operations by tag: ours by what they serve, a peer's compatibility
    routes under the peer's name, each operation under one tag, in the document's tag order."""
    import json

    import pytest
    from litestar import get

    from vllm_srun.app import docs
    from vllm_srun.app.routes import TAGS, tag_of

    doc = json.loads(document_text())
    assert [tag["name"] for tag in doc["tags"]] == list(TAGS)
    assert all(tag["description"] for tag in doc["tags"])
    tags = {(method, path): op["tags"] for path, item in doc["paths"].items() for method, op in item.items()}
    assert all(len(listed) == 1 and listed[0] in TAGS for listed in tags.values()), tags
    assert set(TAGS) == {listed[0] for listed in tags.values()}, "a tag with no operation"
    expected = {
        ("post", "/classify"): "vLLM",
        ("post", "/vllm/classify"): "vLLM",
        ("get", "/vllm/models"): "vLLM",
        ("get", "/vllm/v1/models/{model_id}"): "vLLM",
        ("post", "/v1/score"): "vLLM",
        ("post", "/rerank"): "TEI",
        ("post", "/"): "TEI",
        ("get", "/ping"): "TEI",
        ("post", "/infinity/rerank"): "Infinity",
        ("post", "/v2/embed"): "Cohere",
        ("post", "/embeddings"): "OpenAI",
        ("post", "/v1/embeddings"): "Surfaces",
        ("get", "/v1/models"): "Models",
        ("post", "/v1/jobs"): "Bulk jobs",
        ("get", "/"): "Service",
        ("get", "/health"): "Service",
    }
    assert {key: tags[key][0] for key in expected} == expected

    # A route of this app from a module no tag names fails (here a function of docs.py's);
    # a caller's own route keeps the tags it was declared with.
    with pytest.raises(ValueError, match="in no OpenAPI tag"):
        tag_of(get("/untagged")(docs.render_plugins))

    @get("/elsewhere")
    async def elsewhere() -> None: ...

    assert tag_of(elsewhere) is None
