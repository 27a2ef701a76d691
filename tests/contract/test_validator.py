"""The contract check can fail: bodies that break upstream 2.3.0 are caught, bodies that keep it
(with fields of our own added) pass, and the hook records and, when enforced, fails."""

from __future__ import annotations

import copy
import re
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from contract import hook, readme_table
from contract.schema import COMPONENTS, document
from contract.validator import check, schema_violations, server_timing_violations
from jsonschema import Draft202012Validator

TIMING = {
    "server-timing": "parse;dur=0.02, tokenize;dur=0.1, queue;dur=0.01, forward;dur=4.8, "
    "post;dur=0.03, serialize;dur=0.02, total;dur=5.1",
    "content-type": "application/json",
}
JSON = {"content-type": "application/json"}
USAGE = {"input_tokens": 7, "output_tokens": 0}
INPUT = {"tokens": 7, "processed_tokens": 7, "truncated": False}

CLASSIFY: dict[str, Any] = {
    "model": "m",
    "head": "sentiment",
    "kind": "sequence",
    "labels": ["neg", "pos"],
    "results": [
        {"index": 0, "label": "pos", "probabilities": [0.2, 0.8], "input": INPUT},
        {"index": 1, "error": "max_length_exceeded", "message": "input has 600 tokens", "input": INPUT},
    ],
    "usage": USAGE,
    "meta": {"model_sha256": "ab", "cache": {"hits": 1}},  # `cache` is ours: responses are open
}
TOKEN_CLASSIFY: dict[str, Any] = {
    **CLASSIFY,
    "kind": "token",
    "labels": ["O", "PER"],
    "results": [
        {
            "index": 0,
            "spans": [{"label": "PER", "start": 0, "end": 4, "text": "John", "probability": 0.9}],
            "tokens": [{"start": 0, "end": 4, "probabilities": [0.1, 0.9]}],
            "windows": [{"start": 0, "end": 5, "probabilities": [0.1, 0.9]}],
            "input": {**INPUT, "windows": 1, "tokens_lower_bound": False},
        }
    ],
}
DECISIONS: dict[str, Any] = {
    "model": "judge",
    "answers": {
        "topic": {"type": "choice", "choice": "a", "probabilities": {"a": 0.7, "b": 0.3}, "confidence": 0.7},
        "tags": {"type": "set"},
        "tags.x": {"type": "noul", "noul": 0.8},
        "bad": {"type": None, "error": "invalid_question", "message": "unknown type 'ask'"},
    },
    "sets": {"tags": {"selected": ["x"], "probabilities": {"x": 0.8}}},
    "thresholds": {"tags": 0.5},
    "usage": USAGE,
    "states": {"second": {"model": "judge", "answers": {}, "usage": USAGE}},
}
EMBEDDINGS: dict[str, Any] = {
    "object": "list",
    "model": "emb",
    "data": [
        {"object": "embedding", "index": 0, "embedding": [0.1, 0.2]},
        {"object": "embedding", "index": 1, "embedding": "AAAAAAAAgD8="},
        {"object": "embedding", "index": 2, "error": "max_length_exceeded", "message": "too long"},
    ],
    "usage": {"prompt_tokens": 3, "total_tokens": 3},
    "meta": {"representation": {"model_sha256": "ab", "layer": 6, "dimension": 2, "normalized": True}},
}
RERANK: dict[str, Any] = {
    "model": "rr",
    "results": [{"index": 1, "relevance_score": 0.9, "logit": 2.2, "document": "refund"}],
    "usage": {**USAGE, "prompt_tokens": 7, "total_tokens": 7},
}
ERROR = {"error": {"code": "model_not_found", "message": "no model 'x'", "type": "invalid_request_error"}}
MODELS: dict[str, Any] = {
    "object": "list",
    "api_version": "2.3.0",
    "limits": {"max_bundle_tasks": 64, "max_request_bytes": 1 << 20},
    "data": [
        {
            "id": "m",
            "object": "model",
            "family": "task_heads",
            "surfaces": ["classify"],
            "ready": True,
            "status": "ready",
            "repo": None,
            "reason": None,
            "heads": [{"name": "h", "kind": "sequence", "labels": ["a"], "window": None, "reduction": None}],
            "golden": {"status": "unverified", "reference": None},
            "plugins": [{"group": "family", "name": "task_heads", "distribution": None, "capabilities": {}}],
            "profiles": [{"name": "exact", "numerics": "exact"}],
        }
    ],
}
HEALTH = {"api_version": "2.3.0", "status": "ready", "models": {"m": {"status": "ready", "reason": None}}}


@pytest.mark.parametrize(
    ("method", "path", "status", "body", "headers"),
    [
        ("POST", "/v1/classify", 200, CLASSIFY, TIMING),
        ("POST", "/v1/classify", 200, TOKEN_CLASSIFY, TIMING),
        ("POST", "/v1/decisions", 200, DECISIONS, TIMING),
        ("POST", "/v1/systemone", 200, DECISIONS, TIMING),
        ("POST", "/v1/embeddings", 200, EMBEDDINGS, TIMING),
        ("POST", "/v1/rerank", 200, RERANK, TIMING),
        ("POST", "/v1/rerank", 404, ERROR, TIMING),
        ("POST", "/v1/classify", 401, {"error": {"code": "unauthorized", "message": "key"}}, TIMING),
        ("GET", "/v1/models", 200, MODELS, JSON),
        ("GET", "/health", 200, HEALTH, JSON),
        ("GET", "/health", 503, {**HEALTH, "status": "loading", "reason": "warming up"}, JSON),
        ("GET", "/health/live", 200, {"api_version": "2.3.0", "status": "alive"}, JSON),
        ("GET", "/v1/jobs/x", 200, {"anything": 1}, JSON),  # not upstream's route
    ],
)
def test_bodies_that_keep_the_contract_pass(
    method: str, path: str, status: int, body: Any, headers: dict[str, str]
) -> None:
    assert check(method, path, status, body, headers) == []


def test_bundle_results_keep_their_own_status() -> None:
    bundle = {
        "results": [
            {"id": "a", "status": 200, "classify": CLASSIFY},
            {"id": "b", "status": 404, "error": ERROR["error"]},
        ]
    }
    assert check("POST", "/v1/bundle", 200, bundle, TIMING) == []
    broken = copy.deepcopy(bundle)
    broken["results"][0]["classify"]["results"][0]["error"] = {"code": "unavailable", "message": "m"}
    del broken["results"][1]["error"]
    found = check("POST", "/v1/bundle", 200, broken, TIMING)
    assert any("results[0].classify.results[0].error" in line for line in found), found
    assert any("results[1]: status 404 needs error" in line for line in found), found


def test_item_error_as_an_object_is_a_violation() -> None:
    """The shape this server answered before issue 14: `error: {code, message}` on an item."""
    old = copy.deepcopy(CLASSIFY)
    old["results"][1]["error"] = {"code": "max_length_exceeded", "message": "too long"}
    found = check("POST", "/v1/classify", 200, old, TIMING)
    assert found and all("$.results[1].error" in line for line in found), found
    answer = copy.deepcopy(DECISIONS)
    answer["answers"]["bad"]["error"] = {"code": "invalid_question", "message": "x"}
    assert any("$.answers.bad.error" in line for line in check("POST", "/v1/decisions", 200, answer, TIMING))


@pytest.mark.parametrize(
    ("component", "body", "where"),
    [
        ("ClassifyResponse", {k: v for k, v in CLASSIFY.items() if k != "kind"}, "'kind' is a required"),
        ("ClassifyResponse", {**CLASSIFY, "kind": "multilabel"}, "$.kind"),
        ("ClassifyResponse", {**CLASSIFY, "usage": {"prompt_tokens": 1}}, "$.usage"),
        (
            "ClassifyResponse",
            {**TOKEN_CLASSIFY, "results": [{"index": 0, "spans": [{"score": 1}]}]},
            "spans[0]",
        ),
        (
            "ClassifyResponse",
            {**CLASSIFY, "results": [{"index": 0, "error": "forward_failed"}]},
            "$.results[0]",
        ),
        ("DecisionResponse", {k: v for k, v in DECISIONS.items() if k != "usage"}, "'usage' is a required"),
        ("DecisionResponse", {**DECISIONS, "sets": {"t": {"selected": "x"}}}, "$.sets.t"),
        (
            "EmbeddingsResponse",
            {**EMBEDDINGS, "data": [{"object": "embedding", "index": 0, "embedding": "**"}]},
            "",
        ),
        (
            "EmbeddingsResponse",
            {**EMBEDDINGS, "meta": {"representation": {"model_sha256": "a"}}},
            "representation",
        ),
        ("RerankResponse", {**RERANK, "results": [{"index": 0, "document": {"text": "x"}}]}, "document"),
        ("RerankResponse", {**RERANK, "usage": {"prompt_tokens": 1, "total_tokens": 1}}, "$.usage"),
        ("ErrorResponse", {"error": {"code": "forward_failed", "message": "m"}}, "$.error.code"),
        ("ModelList", {**MODELS, "limits": {"max_bundle_tasks": 0, "max_request_bytes": 1}}, "limits"),
        ("ModelList", {**MODELS, "data": [{**MODELS["data"][0], "golden": "unverified"}]}, "golden"),
        ("ModelList", {**MODELS, "data": [{**MODELS["data"][0], "status": "not_ready"}]}, "status"),
        ("Health", {"status": "ok"}, "api_version"),
        ("Liveness", {"api_version": "2.3.0", "status": "ok"}, "$.status"),
    ],
)
def test_each_component_refuses_a_wrong_body(component: str, body: Any, where: str) -> None:
    found = schema_violations(component, body)
    assert found and any(where in line for line in found), found


def test_route_and_status_pick_the_component() -> None:
    error = {"error": {"code": "forward_failed", "message": "m"}}
    assert check("POST", "/v1/classify", 500, error, TIMING)  # upstream's status: upstream's codes
    assert check("POST", "/v1/classify", 401, error, TIMING) == []  # our status: our codes
    assert check("POST", "/v1/systemone", 200, CLASSIFY, TIMING)  # the decisions component
    assert check("GET", "/health", 200, {**HEALTH, "status": "loading"}, JSON)  # 200 only when ready
    assert check("GET", "/health/live", 200, {"api_version": "1.0.0", "status": "alive"}, JSON)
    assert check("GET", "/metrics", 200, "x 1", {"content-type": "application/json"})
    assert check("GET", "/metrics", 200, "x 1", {"content-type": "text/plain; version=0.0.4"}) == []
    assert check("POST", "/v1/classify", 200, b"{not json", TIMING)
    assert check("POST", "/v1/classify?x=1", 200, {"labels": []}, TIMING)
    labels = copy.deepcopy(CLASSIFY)
    labels["results"][0]["probabilities"] = [1.0]
    assert check("POST", "/v1/classify", 200, labels, TIMING)


def test_server_timing_needs_every_upstream_phase() -> None:
    assert server_timing_violations(TIMING["server-timing"]) == []
    assert server_timing_violations(None) == ["Server-Timing header missing"]
    old = "tokenize;dur=0.1, queue;dur=0.2, forward;dur=3, total;dur=3.4"
    assert "lacks the phases ['parse', 'post', 'serialize']" in server_timing_violations(old)[0]
    assert server_timing_violations(TIMING["server-timing"].replace("dur=0.02,", "dur=x,"))
    assert check("POST", "/v1/classify", 404, ERROR, JSON)  # errors carry it too
    assert check("GET", "/v1/models", 200, MODELS, JSON) == []  # not a timed route


def test_every_component_is_a_valid_schema() -> None:
    names = {
        *"DecisionResponse DecisionStateResponse Answer ItemError Span SetAnswer Usage ResponseMeta".split(),
        *"Representation ClassifyResponse ClassifyResult ClassifyWindow TokenProbabilities InputUsage".split(),
        *"EmbeddingsResponse Embedding EmbeddingVector EmbeddingsUsage RerankResponse RerankResult".split(),
        *"BundleResponse BundleResult ErrorResponse ErrorBody ModelList ProcessLimits ModelCard HeadCard".split(),
        *"HeadWindow EmbeddingCard RerankCard RerankExit ModelLimits ProfileInfo GoldenStatus PluginInfo".split(),
        *"Health ModelHealth Liveness".split(),
    }
    assert names <= set(COMPONENTS), names - set(COMPONENTS)
    for name in COMPONENTS:
        Draft202012Validator.check_schema(document(name))


def test_the_hook_records_and_when_enforced_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrong body through a real httpx.Client reaches the log; with ENFORCE the test fails."""
    old = copy.deepcopy(CLASSIFY)
    old["results"][1]["error"] = {"code": "max_length_exceeded", "message": "too long"}

    def reply(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=old, headers={"server-timing": TIMING["server-timing"]})

    mark = len(hook.LOG.violations)
    with httpx.Client(transport=httpx.MockTransport(reply), base_url="http://contract") as client:
        client.post("/v1/classify", json={"input": "x"})
    recorded = hook.LOG.violations[mark:]
    del hook.LOG.violations[mark:]  # this test's own violation is the point, not a finding
    assert [v.line for v in recorded] == check("POST", "/v1/classify", 200, old, TIMING)
    assert recorded and recorded[0].test == hook.LOG.current

    item = SimpleNamespace(nodeid="tests/x.py::t")
    hook._marks[item.nodeid] = len(hook.LOG.violations)
    hook.LOG.violations.append(hook.Violation(item.nodeid, "POST /v1/classify 200: broken"))
    try:
        for enforce in (False, True):
            monkeypatch.setattr(hook, "ENFORCE", enforce)
            wrapper = hook.pytest_runtest_call(item)  # type: ignore[arg-type]
            next(wrapper)
            if enforce:
                with pytest.raises(AssertionError, match="1 violations of upstream's contract"):
                    wrapper.send(None)
            else:
                with pytest.raises(StopIteration):
                    wrapper.send(None)
    finally:
        hook.LOG.violations.pop()
        del hook._marks[item.nodeid]


def test_readme_table_covers_every_component_with_no_blank_row() -> None:
    """The router page's (docs/router.md) "upstream 2.3.0 field -> status here" table: a status of the three kinds on
    every row, and every response component of the schema named in it."""
    table = readme_table.rows()
    assert len(table) > 200, len(table)
    for component, field, status in table:
        assert component and field and status.startswith(("served", "refused with", "absent (")), (
            field,
            status,
        )
    named = " ".join(component for component, _, _ in table)
    value_types = {"EmbeddingVector"}  # Embedding.embedding's row says what it is
    assert {c for c in COMPONENTS if not re.search(rf"\b{c}\b", named)} == value_types
    assert ("ModelLimits", "max_scan_tokens") in readme_table.absent()


@pytest.mark.contract_exempt("proves the marker: this test's peer is not this server")
def test_an_exempt_test_is_not_checked() -> None:
    def reply(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text="not json")

    mark = len(hook.LOG.violations)
    with httpx.Client(transport=httpx.MockTransport(reply), base_url="http://toy") as client:
        client.get("/health")
    assert hook.LOG.exempt and len(hook.LOG.violations) == mark


def test_a_non_number_in_a_float_vector_is_caught() -> None:
    """The validator's fast path over float vectors must not hide a bad element."""
    for bad in ("x", True, None):
        body = copy.deepcopy(EMBEDDINGS)
        body["data"][0]["embedding"] = [0.1, bad, 0.3]
        assert check("POST", "/v1/embeddings", 200, body, TIMING), bad
        bundle = {"results": [{"id": "e", "status": 200, "embeddings": body}]}
        assert check("POST", "/v1/bundle", 200, bundle, TIMING), bad


async def test_the_hook_sees_async_clients_too() -> None:
    def reply(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"api_version": "2.3.0", "status": "dead"})

    mark = len(hook.LOG.violations)
    async with httpx.AsyncClient(transport=httpx.MockTransport(reply), base_url="http://contract") as client:
        await client.get("/health/live")
    recorded = [v.line for v in hook.LOG.violations[mark:]]
    del hook.LOG.violations[mark:]
    assert recorded == ["GET /health/live 200: Liveness at $.status: 'dead' is not one of ['alive']"]
