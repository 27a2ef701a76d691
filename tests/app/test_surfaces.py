"""Every surface of a served keyword model, over real HTTP."""

from __future__ import annotations

import base64
from collections.abc import Callable

import numpy as np
import pytest
from helpers import Server, metric, write_keywords


@pytest.fixture(scope="module")
def server(module_server: Callable[..., Server], tmp_path_factory: pytest.TempPathFactory) -> Server:
    package = write_keywords(tmp_path_factory.mktemp("pkg") / "kw")
    return module_server(str(package), "--served-model-name", "kw")


def test_classify_labels_and_probabilities(server: Server) -> None:
    r = server.post("/v1/classify", {"input": ["Please refund the invoice", "Where is my parcel?", "hello"]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["labels"] == ["billing", "shipping", "other"]
    assert [x["label"] for x in body["results"]] == ["billing", "shipping", "other"]
    for result in body["results"]:
        # A float64 softmax of three logits sums to 1 within a few float64 ulps (2e-16 each);
        # JSON carries float64 exactly.
        assert abs(sum(result["probabilities"]) - 1.0) < 1e-9
        assert result["score"] == max(result["probabilities"])


def test_classify_single_string_and_pair(server: Server) -> None:
    single = server.post("/v1/classify", {"input": "refund"}).json()
    assert single["results"][0]["label"] == "billing"
    pair = server.post("/v1/classify", {"input": [{"text": "where is", "text_pair": "my parcel"}]}).json()
    assert pair["results"][0]["label"] == "shipping"


def test_embeddings_openai_shape_base64_and_dimensions(server: Server) -> None:
    r = server.post("/v1/embeddings", {"input": ["refund parcel", "nothing here"], "model": "kw"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == "kw"
    assert body["usage"] == {"prompt_tokens": 4, "total_tokens": 4}
    first = np.array(body["data"][0]["embedding"])
    # Unit vectors normalised in float32: each component within an ulp (6e-8 relative), so the
    # norm of a handful of them within a few float32 epsilons of 1.
    assert body["data"][0]["object"] == "embedding" and abs(np.linalg.norm(first) - 1) < 1e-6
    assert not any(body["data"][1]["embedding"])
    b64 = server.post("/v1/embeddings", {"input": "refund parcel", "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(b64["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_array_equal(decoded, first.astype(np.float32))
    short = server.post("/v1/embeddings", {"input": "refund parcel", "dimensions": 4}).json()
    vector = np.array(short["data"][0]["embedding"])
    assert vector.shape == (4,) and abs(np.linalg.norm(vector) - 1) < 1e-6


def test_rerank_orders_by_score_with_top_n(server: Server) -> None:
    docs = ["a parcel", "refund please", {"text": "refund the invoice charge"}]
    r = server.post(
        "/v1/rerank", {"query": "refund", "documents": docs, "top_n": 2, "return_documents": True}
    )
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["index"] for x in results] == [1, 2]
    assert results[0]["relevance_score"] >= results[1]["relevance_score"]
    assert results[0]["document"] == "refund please"  # upstream's: the text, whatever was sent
    assert results[1]["document"] == "refund the invoice charge"


def test_models_lists_plugins_with_distribution_and_version(server: Server) -> None:
    body = server.get("/v1/models").json()
    model = body["data"][0]
    assert model["id"] == "kw" and model["engine"] == "example_counts" and model["state"] == "ready"
    assert model["heads"][0]["labels"] == ["billing", "shipping", "other"]
    # The routes that reach the model, from the descriptors of the surfaces it serves.
    assert model["surfaces"] == ["classify", "embeddings", "rerank"]
    assert model["routes"] == [
        "/v1/classify",
        "/predict",
        "/classify",
        "/vllm/classify",
        "/infinity/classify",
        "/v1/embeddings",
        "/embed",
        "/embed_sparse",
        "/embed_all",
        "/similarity",
        "/embeddings",
        "/infinity/embeddings",
        "/vllm/embeddings",
        "/vllm/v1/embeddings",
        "/pooling",
        "/vllm/pooling",
        "/v1/embed",
        "/v2/embed",
        "/v1/rerank",
        "/rerank",
        "/v2/rerank",
        "/vllm/rerank",
        "/vllm/v1/rerank",
        "/infinity/rerank",
        "/score",
        "/v1/score",
        "/vllm/score",
        "/vllm/v1/score",
    ]
    families = {p["name"]: p for p in body["plugins"]["families"]}
    assert families["example_keywords"]["distribution"] == "vllm-sr-example"
    assert families["example_keywords"]["version"] == "0.1.0"
    cpu = {p["name"]: p for p in body["plugins"]["accelerators"]}["cpu"]
    assert cpu["distribution"] == "vllm-srun" and cpu["version"]


def test_health_and_live(server: Server) -> None:
    assert server.get("/health").json() == {
        "api_version": "2.3.0",
        "status": "ready",
        "reason": None,
        "model": "kw",
        "models": {"kw": {"status": "ready"}},
        "states": {"kw": "ready"},
    }
    assert server.get("/health/live").json() == {"api_version": "2.3.0", "status": "alive"}


def test_server_timing_on_every_response(server: Server) -> None:
    ok = server.post("/v1/classify", {"input": "refund"})
    for part in ("tokenize;dur=", "queue;dur=", "forward;dur=", "total;dur="):
        assert part in ok.headers["server-timing"]
    bad = server.post("/v1/classify", {"nope": 1})
    assert bad.status_code == 400 and "total;dur=" in bad.headers["server-timing"]
    assert "total;dur=" in server.get("/v1/models").headers["server-timing"]


def test_cache_hit_runs_no_forward(server: Server) -> None:
    body = {"input": ["a text never seen before: refund"], "options": {"return_meta": True}}
    first = server.post("/v1/classify", body).json()
    assert first["meta"]["cache"] == {"hits": 0, "misses": 1}
    assert first["meta"]["engine"] == "example_counts" and first["meta"]["numerics"] == "float32"
    forwards = metric(server.get("/metrics").text, "vllm_srun_batch_size_count", model="kw")
    second = server.post("/v1/classify", body).json()
    assert second["meta"]["cache"] == {"hits": 1, "misses": 0}
    assert second["results"] == first["results"]
    text = server.get("/metrics").text
    assert metric(text, "vllm_srun_batch_size_count", model="kw") == forwards
    assert metric(text, "vllm_srun_cache_hits_total", model="kw") >= 1


def test_duplicates_in_one_request_run_once(server: Server) -> None:
    # Unknown words all map to term 0, so these token sequences are new to this server.
    twice = "charge " * 7 + "parcel " * 3
    once = "delivery " * 9
    body = {"input": [twice, twice, once], "options": {"return_meta": True}}
    before = metric(server.get("/metrics").text, "vllm_srun_batch_size_sum", model="kw")
    r = server.post("/v1/classify", body).json()
    assert r["results"][0]["probabilities"] == r["results"][1]["probabilities"]
    assert r["meta"]["cache"] == {"hits": 0, "misses": 3}
    after = metric(server.get("/metrics").text, "vllm_srun_batch_size_sum", model="kw")
    assert after - before == 2


def test_metrics_count_requests_by_model_surface_status(server: Server) -> None:
    server.post("/v1/classify", {"input": "refund"})
    before = metric(server.get("/metrics").text, "vllm_srun_requests_total", surface="rerank", status="400")
    server.post("/v1/rerank", {"query": 3, "documents": []})
    text = server.get("/metrics").text
    assert metric(text, "vllm_srun_requests_total", model="kw", surface="classify", status="200") >= 1
    assert metric(text, "vllm_srun_requests_total", surface="rerank", status="400") == before + 1
    assert "vllm_srun_request_latency_seconds_bucket" in text and "vllm_srun_queue_depth" in text


def test_openapi_document_is_served(server: Server) -> None:
    doc = server.get("/openapi.json").json()
    assert "/v1/classify" in doc["paths"] and "/v1/embeddings" in doc["paths"]


def test_a_plugin_family_takes_the_upstream_options_or_refuses_them(server: Server) -> None:
    """The example family honours `options.max_tokens`, `options.profile` and `head`, and refuses
    rerank exits it does not have, naming each field: never a silent ignore."""
    three = "refund the invoice"
    budget = server.post("/v1/classify", {"input": [three, "refund"], "options": {"max_tokens": 2}})
    assert budget.status_code == 200, budget.text
    failed, fine = budget.json()["results"]
    assert failed["error"] == "max_length_exceeded" and "options.max_tokens" in failed["message"]
    assert fine["label"] == "billing"
    cut = server.post("/v1/classify", {"input": three, "options": {"max_tokens": 2, "overflow": "truncate"}})
    assert cut.json()["results"][0]["input"]["processed_tokens"] == 2
    # A limit, profile or head the model does not have is the model's refusal (422), not the document's.
    for body, param, status in (
        ({"input": "x", "options": {"max_tokens": 100000}}, "options.max_tokens", 422),
        ({"input": "x", "options": {"profile": "max_speed"}}, "options.profile", 422),
        ({"input": "x", "head": "other"}, "head", 422),
    ):
        refused = server.post("/v1/classify", body)
        assert refused.status_code == status and refused.json()["error"]["param"] == param, refused.text
    assert server.post("/v1/classify", {"input": "refund", "head": "keywords"}).status_code == 200
    for field in ("layer", "dimensions"):
        refused = server.post("/v1/rerank", {"query": "refund", "documents": ["refund"], field: 1})
        assert refused.status_code == 422 and refused.json()["error"]["param"] == field, refused.text
