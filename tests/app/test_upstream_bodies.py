"""Classify, embeddings and rerank over real HTTP in upstream 2.3.0's shapes, on the task-heads
fixtures: kinds, usage, spans and per-token probabilities, windows, pairs, the per-input token
budget (`options.max_tokens`), `head`, `profile`, rerank documents as strings and its exit."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from helpers import Server

# Fixture packages (vllm_srun.testing.task_heads_fixtures): 2 layers, hidden size 32, 128 positions.
LAYERS, HIDDEN, MAX_TOKENS = 2, 32, 128
MODELS = {
    "seq": "bert-sequence",
    "multi": "bert-multilabel",
    "tagger": "bert-token",
    "ranker": "bert-reranker",
    "embedder": "bert-embedding",
    "binary": "modernbert-sequence",
}
TEXT = "john smith lives in paris and works for google in new york city"
LONG = " ".join(["the movie was very good and the food was great"] * 30)


@pytest.fixture(scope="module")
def server(module_server: Callable[..., Server], tmp_path_factory: pytest.TempPathFactory) -> Server:
    from vllm_srun.testing.task_heads_fixtures import write_fixture

    root = tmp_path_factory.mktemp("upstream-bodies")
    entries = "".join(
        f"  - model: {write_fixture(root / name, variant=variant)}\n    name: {name}\n    device: cpu\n"
        for name, variant in MODELS.items()
    )
    models = root / "models.yaml"
    models.write_text("models:\n" + entries)
    return module_server("--models", str(models))


def ok(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def refused(response: httpx.Response, param: str, status: int = 400) -> str:
    """A 400 invalid_request (or the model's 422, upstream's code for it) naming `param`; its
    message."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    code = "invalid_request" if status == 400 else "unsupported_surface"
    assert error["code"] == code and error["param"] == param, error
    assert param in error["message"]
    return str(error["message"])


def tokens_of(server: Server, model: str, text: str) -> int:
    body = ok(server.post("/v1/classify", {"model": model, "input": text}))
    return int(body["results"][0]["input"]["tokens"])


def test_classify_sequence_answers_kind_labels_and_usage(server: Server) -> None:
    body = ok(server.post("/v1/classify", {"model": "seq", "input": ["good movie", "bad food"]}))
    assert (body["model"], body["head"], body["kind"]) == ("seq", "sequence", "sequence")
    assert body["labels"] == ["negative", "neutral", "positive"]
    processed = sum(r["input"]["processed_tokens"] for r in body["results"])
    assert body["usage"] == {"input_tokens": processed, "output_tokens": 0}
    for result in body["results"]:
        assert math.isclose(sum(result["probabilities"]), 1.0, abs_tol=1e-6)
        assert result["label"] == body["labels"][result["probabilities"].index(max(result["probabilities"]))]
        assert "scores" not in result and "windows" not in result
        assert set(result["input"]) >= {"tokens", "processed_tokens", "truncated", "tokens_lower_bound"}


def test_pair_input_and_grounded_items(server: Server) -> None:
    single = ok(server.post("/v1/classify", {"model": "seq", "input": "what is the capital"}))
    pair = ok(
        server.post(
            "/v1/classify", {"model": "seq", "input": [{"text": "what is the capital", "text_pair": "paris"}]}
        )
    )
    # The pair is one input: its second text and a separator join the first.
    assert pair["results"][0]["input"]["tokens"] > single["results"][0]["input"]["tokens"]
    assert pair["results"][0]["probabilities"] != single["results"][0]["probabilities"]
    grounded = {"context": "paris is in france", "question": "where is paris", "answer": "france"}
    # A head no model here has: the model's refusal (422), naming the field.
    message = refused(
        server.post("/v1/classify", {"model": "seq", "input": [grounded]}), "input[0].context", 422
    )
    assert "grounded" in message
    alone = refused(
        server.post("/v1/classify", {"model": "seq", "input": {"answer": "x"}}), "input.answer", 422
    )
    assert "grounded" in alone
    refused(server.post("/v1/classify", {"model": "seq", "input": [{"text_pair": "x"}]}), "input[0].text")


def test_head_is_top_level_with_options_head_as_alias(server: Server) -> None:
    top = ok(server.post("/v1/classify", {"model": "binary", "input": "good", "head": "relevance"}))
    alias = ok(
        server.post("/v1/classify", {"model": "binary", "input": "good", "options": {"head": "relevance"}})
    )
    assert top["results"] == alias["results"] and top["head"] == alias["head"] == "relevance"
    # A relevance head answers label scores: a two-label model's is the softmax of its labels.
    assert top["kind"] == "scores" and top["labels"] == ["negative", "positive"]
    result = top["results"][0]
    negative, positive = result["scores"]
    # The first is 1 - the second, in float64: their sum is 1 within a float64 ulp.
    assert math.isclose(negative + positive, 1.0, abs_tol=1e-9) and result["score"] == positive
    both = {"model": "binary", "input": "good", "head": "relevance", "options": {"head": "sequence"}}
    refused(server.post("/v1/classify", both), "head")
    same = {"model": "binary", "input": "good", "head": "sequence", "options": {"head": "sequence"}}
    assert ok(server.post("/v1/classify", same))["kind"] == "sequence"
    assert "nope" in refused(
        server.post("/v1/classify", {"model": "seq", "input": "x", "head": "nope"}), "head", 422
    )


def test_multilabel_answers_scores_and_selected(server: Server) -> None:
    body = ok(server.post("/v1/classify", {"model": "multi", "input": TEXT, "options": {"threshold": 0.3}}))
    assert body["kind"] == "scores"
    result = body["results"][0]
    assert "probabilities" not in result and len(result["scores"]) == len(body["labels"])
    assert result["selected"] == [
        label for label, s in zip(body["labels"], result["scores"], strict=True) if s >= 0.3
    ]


def test_token_head_spans_carry_probability_and_tokens_their_distribution(server: Server) -> None:
    body = ok(
        server.post(
            "/v1/classify",
            {"model": "tagger", "input": TEXT, "options": {"return_tokens": True, "threshold": 0.0}},
        )
    )
    assert body["kind"] == "token" and body["head"] == "token"
    result = body["results"][0]
    assert result["spans"], "the random tagger labels some word of the text"
    for span in result["spans"]:
        assert set(span) == {"label", "start", "end", "text", "probability"}
        assert TEXT[span["start"] : span["end"]] == span["text"] and 0 <= span["probability"] <= 1
    tokens = result["tokens"]
    assert len(tokens) == result["input"]["tokens"] - 2  # every token of the text, no [CLS]/[SEP]
    for token in tokens:
        assert len(token["probabilities"]) == len(body["labels"])
        assert math.isclose(sum(token["probabilities"]), 1.0, abs_tol=1e-6)
        assert token["label"] == body["labels"][token["probabilities"].index(max(token["probabilities"]))]
        assert 0 <= token["start"] <= token["end"] <= len(TEXT)


def test_windowed_input_lists_every_window(server: Server) -> None:
    options = {"overflow": "window", "window": {"tokens": 32, "overlap": 8}}
    body = ok(server.post("/v1/classify", {"model": "seq", "input": [LONG, "good"], "options": options}))
    long, short = body["results"]
    content = long["input"]["tokens"] - 2
    windows = long["windows"]
    assert len(windows) == long["input"]["windows"] > 1
    # 30 content tokens per window, stepping by 22: consecutive windows share 8.
    assert [(w["start"], w["end"]) for w in windows] == [
        (22 * k, min(22 * k + 30, content)) for k in range(len(windows))
    ]
    assert windows[-1]["end"] == content
    for window in windows:
        assert math.isclose(sum(window["probabilities"]), 1.0, abs_tol=1e-6) and "scores" not in window
    assert short["input"]["windows"] == 1 and len(short["windows"]) == 1
    scores = ok(server.post("/v1/classify", {"model": "multi", "input": LONG, "options": options}))
    assert all(len(w["scores"]) == 4 and "probabilities" not in w for w in scores["results"][0]["windows"])


def test_max_tokens_is_a_per_input_budget_under_the_overflow_policy(server: Server) -> None:
    n = tokens_of(server, "seq", TEXT)
    over = {"model": "seq", "input": [TEXT, "good"], "options": {"max_tokens": n - 1}}
    body = ok(server.post("/v1/classify", over))
    failed, fine = body["results"]
    assert failed["error"] == "max_length_exceeded" and "options.max_tokens" in failed["message"]
    assert set(failed) == {"index", "error", "message", "input"} and fine["label"]
    over["options"] = {"max_tokens": n - 1, "overflow": "truncate"}
    cut = ok(server.post("/v1/classify", over))["results"][0]["input"]
    assert cut == {
        "tokens": n,
        "processed_tokens": n - 1,
        "truncated": True,
        "tokens_lower_bound": False,
        "windows": 1,
    }
    exact = ok(server.post("/v1/classify", {"model": "seq", "input": TEXT, "options": {"max_tokens": n}}))
    assert "error" not in exact["results"][0]
    # Under the window policy the budget is the largest window.
    windowed = {"model": "seq", "input": LONG, "options": {"max_tokens": 40, "overflow": "window"}}
    result = ok(server.post("/v1/classify", windowed))["results"][0]
    assert all(w["end"] - w["start"] <= 38 for w in result["windows"]) and result["input"]["windows"] > 1
    too_wide = {"max_tokens": 40, "overflow": "window", "window": {"tokens": 64}}
    refused(
        server.post("/v1/classify", {"model": "seq", "input": "x", "options": too_wide}),
        "options.window.tokens",
    )
    # The model's limit is the ceiling; 0 is no budget.
    ceiling = {"model": "seq", "input": "x", "options": {"max_tokens": MAX_TOKENS + 1}}
    refused(server.post("/v1/classify", ceiling), "options.max_tokens", 422)  # the model's limit
    assert (
        server.post("/v1/classify", {"model": "seq", "input": "x", "options": {"max_tokens": 0}}).status_code
        == 400
    )


def test_embeddings_budget_usage_and_meta(server: Server) -> None:
    n = tokens_of(server, "seq", TEXT)  # the same wordpiece vocabulary as the embedder's
    over = {"model": "embedder", "input": ["good", TEXT], "options": {"max_tokens": n - 1}}
    assert "options.max_tokens" in refused(server.post("/v1/embeddings", over), "input[1]")
    over["options"] = {"max_tokens": n - 1, "overflow": "reject"}
    data = ok(server.post("/v1/embeddings", over))["data"]
    assert data[1]["error"] == "max_length_exceeded" and "embedding" not in data[1] and data[0]["embedding"]
    body = ok(
        server.post(
            "/v1/embeddings",
            {"model": "embedder", "input": ["good", TEXT], "dimensions": 8, "options": {"return_meta": True}},
        )
    )
    tokens = sum(d["input"]["processed_tokens"] for d in body["data"])
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    meta = body["meta"]
    assert meta["representation"] == {
        "model_sha256": meta["model_sha256"],
        "layer": LAYERS,
        "dimension": 8,
        "normalized": True,
        "modality": "text",
    }
    assert (meta["model_id"], meta["profile"], meta["numerics"], meta["head"]) == (
        "embedder",
        "exact",
        "float32",
        "pooled",
    )
    assert meta["engine"] and meta["device"] == "cpu" and meta["accelerator"] == "cpu"
    assert meta["queue_ms"] >= 0 and meta["compute_ms"] >= 0 and set(meta["cache"]) == {"hits", "misses"}


def test_profile_must_be_the_served_one(server: Server) -> None:
    exact = {"model": "seq", "input": "good", "options": {"profile": "exact", "return_meta": True}}
    assert ok(server.post("/v1/classify", exact))["meta"]["profile"] == "exact"
    fast = {"model": "seq", "input": "good", "options": {"profile": "max_speed"}}
    # Which profiles a model serves is the model's to say: a 422, as the document allows any name.
    assert "'exact'" in refused(server.post("/v1/classify", fast), "options.profile", 422)
    for path, body in (
        ("/v1/embeddings", {"model": "embedder", "input": "good"}),
        ("/v1/rerank", {"model": "ranker", "query": "q", "documents": ["d"]}),
    ):
        refused(server.post(path, {**body, "options": {"profile": "turbo"}}), "options.profile", 422)
    bad = {"model": "seq", "input": "good", "options": {"profile": "Not-A-Name"}}
    assert server.post("/v1/classify", bad).status_code == 400


def test_rerank_documents_are_strings_and_usage_counts_tokens(server: Server) -> None:
    documents = ["paris is the capital of france", {"text": "good food"}, "the movie"]
    request = {"model": "ranker", "query": "what is the capital", "documents": documents}
    body = ok(
        server.post("/v1/rerank", {**request, "return_documents": True, "options": {"return_meta": True}})
    )
    texts = ["paris is the capital of france", "good food", "the movie"]
    assert all(r["document"] == texts[r["index"]] for r in body["results"])
    tokens = sum(r["input"]["processed_tokens"] for r in body["results"])
    assert body["usage"] == {
        "input_tokens": tokens,
        "output_tokens": 0,
        "prompt_tokens": tokens,
        "total_tokens": tokens,
    }
    assert body["meta"]["head"] == "relevance" and body["meta"]["model_id"] == "ranker"
    # The one exit a model here serves: its last layer at its hidden size.
    same = ok(server.post("/v1/rerank", {**request, "layer": LAYERS, "dimensions": HIDDEN}))
    assert [r["relevance_score"] for r in same["results"]] == [
        r["relevance_score"] for r in ok(server.post("/v1/rerank", request))["results"]
    ]
    assert str(LAYERS) in refused(server.post("/v1/rerank", {**request, "layer": 1}), "layer", 422)
    assert str(HIDDEN) in refused(server.post("/v1/rerank", {**request, "dimensions": 16}), "dimensions", 422)
    n = tokens_of(server, "ranker", "what is the capital")
    budget = {**request, "options": {"max_tokens": n + 3, "overflow": "reject"}}  # "good food" fits
    results = ok(server.post("/v1/rerank", budget))["results"]
    failed = [r for r in results if "error" in r]
    assert failed and all(r["error"] == "max_length_exceeded" for r in failed)
    assert [r for r in results if "error" not in r], "a pair within the budget is still scored"


def test_the_model_cards_state_heads_and_the_rerank_exit(server: Server) -> None:
    cards = {card["id"]: card for card in ok(server.get("/v1/models"))["data"]}
    sequence = cards["seq"]["heads"][0]
    assert (sequence["name"], sequence["kind"], sequence["inputs"]) == (
        "sequence",
        "sequence",
        ["text", "pair"],
    )
    assert (sequence["overflow"], sequence["reduction"]) == ("reject", "max")
    tagger = cards["tagger"]["heads"][0]
    assert (tagger["inputs"], tagger["reduction"]) == (["text"], "span_union")
    assert cards["multi"]["heads"][0]["default_threshold"] == 0.5
    served = {"layer": LAYERS, "dimension": HIDDEN}
    assert cards["ranker"]["rerank"] == {"exits": [served], "default": served}
    assert cards["embedder"]["rerank"]["default"] == served  # its embedding is the hidden size
    assert "rerank" not in cards["tagger"]
    # A cross-encoder's relevance head answers classify too, as label scores: the card says so.
    relevance = cards["ranker"]["heads"][0]
    assert (relevance["kind"], cards["ranker"]["profile"]) == ("scores", "exact")
    assert ok(server.post("/v1/classify", {"model": "ranker", "input": "x"}))["kind"] == "scores"


def test_windows_from_the_budget_name_the_budget(server: Server) -> None:
    # Without window options the windows are max_tokens long: a budget too small to hold one
    # names options.max_tokens, not an options.window the request never set.
    body = {"model": "seq", "input": LONG, "options": {"overflow": "window", "max_tokens": 3}}
    assert "text tokens" in refused(server.post("/v1/classify", body), "options.max_tokens", 422)


def test_embeddings_text_parts_are_texts_and_other_modalities_are_refused(server: Server) -> None:
    plain = ok(server.post("/v1/embeddings", {"model": "embedder", "input": ["good", "bad"]}))
    parts = [{"type": "text", "text": "good"}, "bad"]
    assert ok(server.post("/v1/embeddings", {"model": "embedder", "input": parts}))["data"] == plain["data"]
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    assert "image" in refused(
        server.post("/v1/embeddings", {"model": "embedder", "input": ["good", image]}),
        "input[1].image_url",
        422,  # a modality the model lacks: its refusal
    )
    audio = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    refused(
        server.post("/v1/embeddings", {"model": "embedder", "input": [audio]}), "input[0].input_audio", 422
    )
    refused(
        server.post("/v1/embeddings", {"model": "embedder", "input": [{"type": "text"}]}), "input[0].text"
    )


def test_an_input_past_its_scan_budget_is_not_read(server: Server) -> None:
    from vllm_srun.families.task_heads.windows import MAX_WINDOWS

    # Windows of 8 text tokens stepping by 1: MAX_WINDOWS + 8 tokens need one window too many.
    options = {"overflow": "window", "window": {"tokens": 10, "overlap": 7}}
    words = " ".join(["paris"] * (MAX_WINDOWS + 8))
    body = ok(server.post("/v1/classify", {"model": "seq", "input": [words, "paris"], "options": options}))
    failed, fine = body["results"]
    assert failed["error"] == "scan_budget_exceeded" and str(MAX_WINDOWS + 1) in failed["message"]
    assert failed["input"]["processed_tokens"] == 0 and "windows" not in failed and fine["label"]


def test_an_option_a_surface_does_not_read_is_refused_by_name(server: Server) -> None:
    # Each surface's options type holds only the options it reads (the document says so), and a
    # request setting another one learns so instead of having it ignored.
    refused(
        server.post(
            "/v1/rerank", {"model": "ranker", "query": "q", "documents": ["d"], "options": {"threshold": 0.3}}
        ),
        "options.threshold",
    )
    refused(
        server.post(
            "/v1/embeddings", {"model": "embedder", "input": "x", "options": {"return_tokens": True}}
        ),
        "options.return_tokens",
    )
    refused(
        server.post("/v1/classify", {"model": "seq", "input": "x", "options": {"normalize": False}}),
        "options.normalize",
    )
    # Not a field of the surface's options even at its default (the document lists none such);
    # the surface's own options pass.
    refused(
        server.post(
            "/v1/rerank",
            {"model": "ranker", "query": "q", "documents": ["d"], "options": {"return_tokens": False}},
        ),
        "options.return_tokens",
    )
    ok(
        server.post(
            "/v1/rerank", {"model": "ranker", "query": "q", "documents": ["d"], "options": {"max_tokens": 64}}
        )
    )
    ok(server.post("/v1/embeddings", {"model": "embedder", "input": "x", "options": {"normalize": False}}))
    # In a bundle the task fails alone, with the status it would have had on its own route.
    body = ok(
        server.post(
            "/v1/bundle",
            {
                "tasks": [
                    {
                        "id": "a",
                        "embeddings": {"model": "embedder", "input": "x", "options": {"threshold": 0.5}},
                    },
                    {"id": "b", "embeddings": {"model": "embedder", "input": "x"}},
                ]
            },
        )
    )
    assert [r["status"] for r in body["results"]] == [400, 200]
    assert body["results"][0]["error"]["code"] == "invalid_request"
    assert "options.threshold" in body["results"][0]["error"]["message"]


@pytest.mark.parametrize(
    ("model", "option", "value"),
    [
        ("seq", "threshold", 0.3),
        ("seq", "return_tokens", True),
        ("binary", "threshold", 0.3),
        ("ranker", "threshold", 0.3),
        ("ranker", "return_tokens", True),
        ("multi", "return_tokens", True),
    ],
)
def test_a_classify_option_the_head_does_not_read_is_refused_by_name(
    server: Server, model: str, option: str, value: object
) -> None:
    # Classify takes threshold and return_tokens, but only some heads read them: a head that
    # would answer as if the option were unset refuses it instead: the model's refusal, 422.
    refused(
        server.post("/v1/classify", {"model": model, "input": "x", "options": {option: value}}),
        f"options.{option}",
        422,
    )


def test_a_classify_option_the_head_reads_is_taken(server: Server) -> None:
    ok(server.post("/v1/classify", {"model": "multi", "input": "x", "options": {"threshold": 0.3}}))
    ok(server.post("/v1/classify", {"model": "tagger", "input": "x", "options": {"threshold": 0.3}}))
    ok(server.post("/v1/classify", {"model": "tagger", "input": "x", "options": {"return_tokens": True}}))
    # Set to its default, an option counts as not set.
    ok(server.post("/v1/classify", {"model": "seq", "input": "x", "options": {"return_tokens": False}}))
