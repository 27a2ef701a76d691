"""The peers' remaining routes over real HTTP, each an adapter whose numbers must be the
surface's: TEI's /similarity, /embeddings, /invocations, GET / and /ping; vLLM's /score,
/v1/score, /classify and /pooling (and their /vllm twins); /rerank told apart by its body.

all-MiniLM-L6-v2 for the embedding routes (cosines against /v1/embeddings' vectors, 1e-6 for
float32 vectors through JSON), the tiny bert-reranker fixture for the scores and the
three-label bert-sequence fixture for vLLM's classify (the same floats as /v1/rerank's and
/v1/classify's, to 1e-12).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from helpers import Server, minilm_dir, ok

from vllm_srun.testing.task_heads_fixtures import write_fixture

SAME = 1e-12
FLOAT32 = 1e-6
SOURCE = "where do foxes live"
SENTENCES = ["foxes live in dens", "a recipe for bread", "where do foxes live"]


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("peer-routes")
    return {
        "reranker": write_fixture(root / "reranker", variant="bert-reranker"),
        "sequence": write_fixture(root / "sequence", variant="bert-sequence"),
    }


@pytest.fixture(scope="module")
def minilm(module_server: Callable[..., Server]) -> Server:
    return module_server(str(minilm_dir()), "--served-model-name", "minilm", "--max-inputs", "4")


@pytest.fixture(scope="module")
def reranker(module_server: Callable[..., Server], packages: dict[str, Path]) -> Server:
    return module_server(str(packages["reranker"]), "--served-model-name", "reranker")


@pytest.fixture(scope="module")
def classifier(module_server: Callable[..., Server], packages: dict[str, Path]) -> Server:
    return module_server(str(packages["sequence"]), "--served-model-name", "sentiment")


def vectors(server: Server, texts: list[str]) -> np.ndarray:
    body = ok(server, "/v1/embeddings", {"input": texts})
    return np.asarray([item["embedding"] for item in body["data"]], dtype=np.float64)


def cosines(source: np.ndarray, others: np.ndarray) -> np.ndarray:
    out: np.ndarray = others @ source / (np.linalg.norm(others, axis=1) * np.linalg.norm(source))
    return out


# -- TEI -----------------------------------------------------------------------------------------


def test_similarity_is_the_cosine_of_the_surface_vectors(minilm: Server) -> None:
    body = {"inputs": {"source_sentence": SOURCE, "sentences": SENTENCES}}
    got = ok(minilm, "/similarity", body)
    every = vectors(minilm, [SOURCE, *SENTENCES])
    np.testing.assert_allclose(got, cosines(every[0], every[1:]), atol=FLOAT32)
    assert abs(got[2] - 1.0) < FLOAT32 and got[0] > got[1]
    # POST / on an embedding model answers a similarity body as TEI's sentence-similarity task.
    assert ok(minilm, "/", body) == got
    assert ok(minilm, "/invocations", body) == got
    # huggingface_hub's sentence-similarity task (it posts that body to the base URL) reads it.
    from huggingface_hub import InferenceClient

    assert InferenceClient(base_url=minilm.url).sentence_similarity(SOURCE, other_sentences=SENTENCES) == got


def test_similarity_errors_are_teis(minilm: Server) -> None:
    empty = minilm.post("/similarity", {"inputs": {"source_sentence": "a", "sentences": []}})
    assert empty.status_code == 400 and empty.json() == {
        "error": "`inputs.sentences` cannot be empty",
        "error_type": "empty",
    }
    # The source counts against the batch bound (--max-inputs 4), as in TEI.
    over = minilm.post("/similarity", {"inputs": {"source_sentence": "a", "sentences": ["b"] * 4}})
    assert over.status_code == 413 and over.json()["error_type"] == "validation"
    typo = minilm.post("/similarity", {"inputs": {"source_sentence": "a", "sentence": ["b"]}})
    assert typo.status_code == 422 and "sentence" in typo.json()["error"]


def test_root_embeddings_and_invocations_answer_as_their_routes(minilm: Server) -> None:
    texts = SENTENCES[:2]
    # TEI ignores `model` and Infinity's client sends `dimensions: 0` and `modality`.
    body = {"input": texts, "model": "text-embedding-3-small", "dimensions": 0, "modality": "text"}
    answer = ok(minilm, "/embeddings", body)
    assert answer["model"] == "minilm" and answer["object"] == "list"
    np.testing.assert_allclose([d["embedding"] for d in answer["data"]], vectors(minilm, texts), atol=SAME)
    embedded = ok(minilm, "/invocations", {"inputs": texts})
    assert embedded == ok(minilm, "/embed", {"inputs": texts})
    refused = minilm.post("/embeddings", {"input": texts, "modality": "image"})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "modality"
    for mixed in (["a", [1, 2]], {"text": "a"}):
        refused = minilm.post("/embeddings", {"input": mixed})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "input", refused.text


def test_health_routes_answer_200s(minilm: Server) -> None:
    response = minilm.get("/ping")
    assert response.status_code == 200 and response.content == b""
    # GET /, the Inference API's health route, is 200 too, with the server's index.
    index = minilm.get("/")
    assert index.status_code == 200 and index.json()["status"] == "ready"
    assert index.json()["name"] == "vllm-srun" and index.json()["links"]["models"] == "/v1/models"
    # OPTIONS names both of the root's methods (Litestar alone would name POST only).
    allowed = httpx.options(minilm.url + "/", timeout=10).headers["allow"]
    assert set(allowed.split(", ")) == {"GET", "OPTIONS", "POST"}


def test_health_routes_are_public_and_the_rest_keyed(
    module_server: Callable[..., Server], packages: dict[str, Path]
) -> None:
    """SageMaker's and the Inference API's health checks send no key, as TEI lets them."""
    server = module_server(str(packages["reranker"]), "--api-key", "sesame")
    for path in ("/", "/ping", "/infinity/health"):
        assert server.get(path).status_code == 200, path
    body = {"text_1": SOURCE, "text_2": SENTENCES}
    assert server.post("/score", body).status_code == 401
    assert server.post("/score", body, headers={"Authorization": "Bearer sesame"}).status_code == 200
    assert server.get("/infinity/models").status_code == 401


# -- vLLM ----------------------------------------------------------------------------------------


def test_score_equals_v1_rerank_for_one_text_1_and_pairwise(reranker: Server) -> None:
    ours = ok(reranker, "/v1/rerank", {"query": SOURCE, "documents": SENTENCES})["results"]
    by_index = {r["index"]: r for r in ours}
    for path in ("/score", "/v1/score", "/vllm/score", "/vllm/v1/score"):
        answer = ok(reranker, path, {"model": "reranker", "text_1": SOURCE, "text_2": SENTENCES})
        assert answer["object"] == "list" and answer["model"] == "reranker"
        assert [d["index"] for d in answer["data"]] == [0, 1, 2]
        assert {d["object"] for d in answer["data"]} == {"score"}
        for item in answer["data"]:
            assert abs(item["score"] - by_index[item["index"]]["relevance_score"]) < SAME
        assert answer["usage"]["prompt_tokens"] > 0
    raw = ok(reranker, "/score", {"text_1": SOURCE, "text_2": SENTENCES, "use_activation": False})
    assert [d["score"] for d in raw["data"]] == [by_index[i]["logit"] for i in range(3)]
    # Two lists: pair by pair; each pair's score is that pair's /v1/rerank score.
    pairwise = ok(reranker, "/score", {"text_1": [SOURCE, "bread"], "text_2": [SENTENCES[0], SENTENCES[1]]})
    alone = ok(reranker, "/v1/rerank", {"query": "bread", "documents": [SENTENCES[1]]})["results"][0]
    assert abs(pairwise["data"][0]["score"] - by_index[0]["relevance_score"]) < SAME
    assert abs(pairwise["data"][1]["score"] - alone["relevance_score"]) < SAME
    uneven = reranker.post("/score", {"text_1": ["a", "b", "c"], "text_2": ["a", "b"]})
    assert uneven.status_code == 400 and uneven.json()["error"]["param"] == "text_2"


def test_score_on_an_embedding_model_is_the_cosine(minilm: Server) -> None:
    answer = ok(minilm, "/score", {"text_1": SOURCE, "text_2": SENTENCES[:2]})
    every = vectors(minilm, [SOURCE, *SENTENCES[:2]])
    np.testing.assert_allclose(
        [d["score"] for d in answer["data"]], cosines(every[0], every[1:]), atol=FLOAT32
    )


def test_rerank_is_teis_or_vllms_by_the_body(reranker: Server) -> None:
    ours = ok(reranker, "/v1/rerank", {"query": SOURCE, "documents": SENTENCES})["results"]
    tei = ok(reranker, "/rerank", {"query": SOURCE, "texts": SENTENCES})
    assert [(r["index"], r["score"]) for r in tei] == [(r["index"], r["relevance_score"]) for r in ours]
    for path in ("/rerank", "/vllm/rerank", "/vllm/v1/rerank"):
        vllm = ok(reranker, path, {"model": "reranker", "query": SOURCE, "documents": SENTENCES, "top_n": 2})
        assert vllm["id"].startswith("rerank-") and vllm["usage"]["total_tokens"] > 0
        assert [(r["index"], r["relevance_score"], r["document"]["text"]) for r in vllm["results"]] == [
            (r["index"], r["relevance_score"], SENTENCES[r["index"]]) for r in ours[:2]
        ]
    # Each shape refuses the other's fields by name, in its own error shape (every field is in
    # the document, so vLLM's shape answers TEI's as an option it does not take: 422).
    mixed = reranker.post("/rerank", {"query": SOURCE, "documents": SENTENCES, "raw_scores": True})
    assert mixed.status_code == 422 and mixed.json()["error"]["param"] == "raw_scores"
    past = reranker.post(
        "/vllm/rerank", {"query": SOURCE, "documents": SENTENCES, "truncate_prompt_tokens": 10**6}
    )
    assert past.status_code == 422 and past.json()["error"]["param"] == "truncate_prompt_tokens"
    for bad in (0, -2, "5"):
        refused = reranker.post(
            "/vllm/rerank", {"query": SOURCE, "documents": SENTENCES, "truncate_prompt_tokens": bad}
        )
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "truncate_prompt_tokens"
    mixed = reranker.post("/rerank", {"query": SOURCE, "texts": SENTENCES, "top_n": 1})
    assert mixed.status_code == 422 and mixed.json() == {
        "error": "top_n: not a field of TEI's rerank body",
        "error_type": "validation",
    }
    neither = reranker.post("/rerank", {"query": SOURCE})
    assert neither.status_code == 422 and neither.json()["error_type"] == "validation"


def test_classify_equals_v1_classify(classifier: Server) -> None:
    texts = ["what a lovely day", "this is terrible"]
    ours = ok(classifier, "/v1/classify", {"input": texts, "options": {"return_logits": True}})
    for path in ("/classify", "/vllm/classify"):
        answer = ok(classifier, path, {"model": "sentiment", "input": texts})
        assert answer["object"] == "list" and answer["id"].startswith("classify-")
        for item, result in zip(answer["data"], ours["results"], strict=True):
            assert item["label"] == result["label"] and item["num_classes"] == 3
            np.testing.assert_allclose(item["probs"], result["probabilities"], atol=SAME)
    raw = ok(classifier, "/classify", {"input": texts[0], "use_activation": False})
    np.testing.assert_allclose(raw["data"][0]["probs"], ours["results"][0]["logits"], atol=SAME)


def test_pooling_answers_the_embeddings_vectors(minilm: Server) -> None:
    for path in ("/pooling", "/vllm/pooling"):
        answer = ok(minilm, path, {"model": "minilm", "input": SENTENCES[:2]})
        assert answer["id"].startswith("pool-") and {d["object"] for d in answer["data"]} == {"pooling"}
        np.testing.assert_allclose(
            [d["data"] for d in answer["data"]], vectors(minilm, SENTENCES[:2]), atol=SAME
        )


def test_an_input_over_the_limit_is_refused_as_vllm_or_truncated_as_infinity(reranker: Server) -> None:
    long = " ".join(["fox"] * 400)  # past the fixture's 128 tokens
    refused = reranker.post("/vllm/rerank", {"query": SOURCE, "documents": [long]})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "documents[0]"
    assert "truncate_prompt_tokens" in refused.json()["error"]["message"]
    cut = ok(reranker, "/vllm/rerank", {"query": SOURCE, "documents": [long], "truncate_prompt_tokens": -1})
    ours = ok(
        reranker, "/v1/rerank", {"query": SOURCE, "documents": [long], "options": {"overflow": "truncate"}}
    )
    assert abs(cut["results"][0]["relevance_score"] - ours["results"][0]["relevance_score"]) < SAME
    infinity = ok(reranker, "/infinity/rerank", {"query": SOURCE, "documents": [long]})
    assert abs(infinity["results"][0]["relevance_score"] - ours["results"][0]["relevance_score"]) < SAME


def test_vllm_base_urls_list_the_models(minilm: Server) -> None:
    """An OpenAI client given vLLM's base URL here (`…/vllm/v1`, or `…/vllm`) lists the models
    there, as vLLM's server serves /v1/models: /v1/models' answer."""
    ours = ok_get(minilm, "/v1/models")
    for path in ("/vllm/v1/models", "/vllm/models"):
        assert ok_get(minilm, path) == ours, path
        assert ok_get(minilm, path + "/minilm") == ok_get(minilm, "/v1/models/minilm"), path
    for base in ("/vllm/v1", "/vllm"):
        client = openai.OpenAI(api_key="unused", base_url=minilm.url + base, max_retries=0)
        assert [m.id for m in client.models.list()] == ["minilm"]
        assert client.models.retrieve("minilm").id == "minilm"
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("no-such-model")


def ok_get(server: Server, path: str) -> Any:
    response = server.get(path)
    assert response.status_code == 200, response.text
    return response.json()


LONG = " ".join(["fox"] * 400)  # past all-MiniLM-L6-v2's 256 tokens and the fixtures' 128


def test_vllm_routes_name_their_own_field_for_an_input_over_the_limit(minilm: Server) -> None:
    """vLLM's way out is its body's `truncate_prompt_tokens`: the routes' refusal says so, never
    this server's `options`, which vLLM's bodies refuse."""
    for path in ("/pooling", "/vllm/pooling"):
        refused = minilm.post(path, {"input": ["short", LONG]})
        error = refused.json()["error"]
        assert refused.status_code == 400 and error["param"] == "input[1]", refused.text
        assert "truncate_prompt_tokens" in error["message"] and "options" not in error["message"]
        cut = ok(minilm, path, {"input": ["short", LONG], "truncate_prompt_tokens": -1})
        ours = ok(minilm, "/v1/embeddings", {"input": ["short", LONG], "options": {"overflow": "truncate"}})
        np.testing.assert_allclose(
            [d["data"] for d in cut["data"]], [d["embedding"] for d in ours["data"]], atol=SAME
        )
    scored = minilm.post("/vllm/score", {"text_1": SOURCE, "text_2": [LONG]})
    assert scored.status_code == 400 and scored.json()["error"]["param"] == "text_2[0]"
    assert "truncate_prompt_tokens" in scored.json()["error"]["message"]
    assert "options" not in scored.json()["error"]["message"]


def test_vllm_classify_names_its_own_field_for_an_input_over_the_limit(classifier: Server) -> None:
    refused = classifier.post("/vllm/classify", {"input": ["fine", LONG]})
    error = refused.json()["error"]
    assert refused.status_code == 400 and error["param"] == "input[1]", refused.text
    assert "truncate_prompt_tokens" in error["message"] and "options" not in error["message"]


def test_root_embeddings_refuse_an_input_over_the_limit_with_a_way_out_it_takes(minilm: Server) -> None:
    """The root /embeddings body has no `options`: its refusal names the server's flag (TEI's
    way on its OpenAI route) and /v1/embeddings, and keeps OpenAI's error shape, so the openai
    client raises its BadRequestError with `param` (see docs/coming-from/tei.md on TEI's shape there)."""
    client = openai.OpenAI(api_key="unused", base_url=minilm.url, max_retries=0)
    with pytest.raises(openai.BadRequestError) as raised:
        client.embeddings.create(input=["short", LONG], model="minilm")
    assert raised.value.param == "input[1]"
    message = raised.value.body["message"]  # type: ignore[index]
    assert "--auto-truncate" in message and "/v1/embeddings" in message, message


def test_vllm_embeddings_take_vllms_fields(minilm: Server) -> None:
    """vLLM's embeddings body is /v1/embeddings' with its own fields: `truncate_prompt_tokens`
    is options.overflow 'truncate' (with max_tokens for a count), `normalize` options.normalize,
    each giving /v1/embeddings' vectors; the openai client's extra_body sends them."""
    texts = ["short", LONG]
    for path in ("/vllm/embeddings", "/vllm/v1/embeddings"):
        cut = ok(minilm, path, {"input": texts, "truncate_prompt_tokens": -1, "priority": 3, "request_id": "r"})
        ours = ok(minilm, "/v1/embeddings", {"input": texts, "options": {"overflow": "truncate"}})
        np.testing.assert_allclose(
            [d["embedding"] for d in cut["data"]], [d["embedding"] for d in ours["data"]], atol=SAME
        )
        eight = ok(minilm, path, {"input": texts, "truncate_prompt_tokens": 8})
        budget = ok(
            minilm, "/v1/embeddings", {"input": texts, "options": {"overflow": "truncate", "max_tokens": 8}}
        )
        assert eight["data"] == budget["data"]
        raw = ok(minilm, path, {"input": texts[:1], "normalize": False})
        unit = ok(minilm, path, {"input": texts[:1]})
        assert raw["data"] == ok(
            minilm, "/v1/embeddings", {"input": texts[:1], "options": {"normalize": False}}
        )["data"]
        assert raw["data"] != unit["data"]  # all-MiniLM-L6-v2 ends in a Normalize module
    client = openai.OpenAI(api_key="unused", base_url=minilm.url + "/vllm/v1", max_retries=0)
    made = client.embeddings.create(input=texts, model="minilm", extra_body={"truncate_prompt_tokens": -1})
    np.testing.assert_allclose(
        [d.embedding for d in made.data], [d["embedding"] for d in ours["data"]], atol=SAME
    )


def test_vllm_embeddings_refuse_in_vllms_words(minilm: Server) -> None:
    refused = minilm.post("/vllm/v1/embeddings", {"input": ["short", LONG]})
    error = refused.json()["error"]
    assert refused.status_code == 400 and error["param"] == "input[1]", refused.text
    assert "truncate_prompt_tokens" in error["message"] and "options" not in error["message"]
    both = minilm.post(
        "/vllm/embeddings",
        {"input": "a", "truncate_prompt_tokens": -1, "options": {"overflow": "window"}},
    )
    assert both.status_code == 400 and both.json()["error"]["param"] == "truncate_prompt_tokens"
    special = minilm.post("/vllm/embeddings", {"input": "a", "add_special_tokens": False})
    assert special.status_code == 422 and special.json()["error"]["param"] == "add_special_tokens"
    stray = minilm.post("/vllm/embeddings", {"input": "a", "truncate": True})
    assert stray.status_code == 400 and "truncate" in stray.text


def test_a_character_bound_under_truncate_prompt_tokens_names_that_field(minilm: Server) -> None:
    """Truncation still reads a bounded number of characters (16 per token of the budget, 1,024
    budgets): past it, vLLM's routes say the bound applies under their field, not options."""
    huge = "fox " * 5000  # 20,000 characters: past the bound for a budget of one token
    for path, body, param in (
        ("/vllm/v1/embeddings", {"input": [huge]}, "input[0]"),
        ("/vllm/pooling", {"input": [huge]}, "input[0]"),
        ("/vllm/score", {"text_1": SOURCE, "text_2": [huge]}, "text_2[0]"),
    ):
        refused = minilm.post(path, {**body, "truncate_prompt_tokens": 1})
        error = refused.json()["error"]
        assert refused.status_code == 413 and error["param"] == param, (path, refused.text)
        assert "under truncate_prompt_tokens" in error["message"] and "options" not in error["message"], error
