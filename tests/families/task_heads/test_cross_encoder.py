"""Rerank prompts on cross-encoders, applied as sentence-transformers' CrossEncoder.predict applies
them: the prompt goes in front of the query of each (query, document) pair.

The packages are written by sentence-transformers itself (`write_cross_encoder`): the tiny BERT
reranker saved as a CrossEncoder with prompts, with and without a default_prompt_name. Over real
HTTP each score is compared with `CrossEncoder(path).predict(pairs, ...)` on seeded random
queries and documents: `logit` with predict(activation_fn=Identity), `relevance_score` with
predict() (its sigmoid), within 1e-4 (float32).

- `prompted`: prompts, no default: no prompt, `prompt_name`, a raw `prompt`.
- `defaulted`: a default_prompt_name: it applies unless the request names another prompt (or ""
  for none), on /v1/rerank, the other rerank routes and /v1/classify pairs alike.
- `plain`: the reranker as Transformers saves it (no sentence-transformers files): a raw prompt
  applies, as predict(prompt=...) applies it; it has no prompt names.
- Refused with the field named: both fields, an unknown name, an over-long prompt (413), and
  any prompt on a bi-encoder's rerank (the query and documents are embedded apart).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from families.task_heads.harness import cross_encoder_predict, random_texts, rerank_over_http
from helpers import Server, serve_named

from vllm_srun.testing.reranker_fixtures import write_cross_encoder
from vllm_srun.testing.task_heads_fixtures import write_fixture

pytestmark = pytest.mark.torch

PROMPTS = {"query": "given a web search query find the document that answers it : ", "city": "which city ? "}
RAW = "is this relevant : "
ATOL = 1e-4


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cross-encoder")
    return {
        "prompted": write_cross_encoder(root / "prompted", prompts=PROMPTS),
        "defaulted": write_cross_encoder(root / "defaulted", prompts=PROMPTS, default_prompt_name="query"),
        "plain": write_fixture(root / "plain", variant="bert-reranker"),
        "embedder": write_fixture(root / "embedder", variant="bert-embedding"),
    }


@pytest.fixture(scope="module")
def server(module_server: Callable[..., Server], packages: dict[str, Path]) -> Server:
    return module_server(*serve_named(packages), "--threads", "1")


@pytest.fixture(scope="module")
def cross_encoders(packages: dict[str, Path]) -> dict[str, Any]:
    from sentence_transformers import CrossEncoder

    return {
        name: CrossEncoder(str(packages[name]), device="cpu") for name in ("prompted", "defaulted", "plain")
    }


def _assert_matches(got: tuple[np.ndarray, np.ndarray], want: tuple[np.ndarray, np.ndarray]) -> None:
    np.testing.assert_allclose(got[0], want[0], atol=ATOL, rtol=0)
    np.testing.assert_allclose(got[1], want[1], atol=ATOL, rtol=0)


def _pairs(seed: int) -> tuple[str, list[str]]:
    query = random_texts(seed=seed, count=1, max_words=10)[0]
    return query, random_texts(seed=seed + 100, count=8, max_words=30)


def test_the_fixture_is_the_form_sentence_transformers_saves(
    packages: dict[str, Path], cross_encoders: dict[str, Any]
) -> None:
    import json

    path = packages["defaulted"]
    saved = json.loads((path / "config_sentence_transformers.json").read_text())
    assert (saved["model_type"], saved["prompts"], saved["default_prompt_name"]) == (
        "CrossEncoder",
        PROMPTS,
        "query",
    )
    assert (path / "modules.json").exists()
    assert cross_encoders["defaulted"].default_prompt_name == "query"
    assert cross_encoders["plain"].prompts == {}


@pytest.mark.parametrize(
    ("model", "extra"),
    [
        ("prompted", {}),
        ("prompted", {"prompt_name": "query"}),
        ("prompted", {"prompt_name": "city"}),
        ("prompted", {"prompt": RAW}),
        ("defaulted", {}),
        ("defaulted", {"prompt_name": "city"}),
        ("defaulted", {"prompt": ""}),
        ("plain", {}),
        ("plain", {"prompt": RAW}),
    ],
)
def test_rerank_matches_cross_encoder_predict(
    server: Server, cross_encoders: dict[str, Any], model: str, extra: dict[str, str]
) -> None:
    query, documents = _pairs(seed=len(model) + 7 * len(extra.get("prompt_name", extra.get("prompt", ""))))
    pairs = [(query, d) for d in documents]
    want = cross_encoder_predict(cross_encoders[model], pairs, **extra)
    _assert_matches(rerank_over_http(server, model, query, documents, **extra), want)
    if extra.get("prompt") or extra.get("prompt_name") or (model == "defaulted" and not extra):
        # The prompt changes the scores: a server that dropped it would not pass above.
        unprompted = cross_encoder_predict(cross_encoders["plain"], pairs)
        assert np.max(np.abs(want[0] - unprompted[0])) > 1e-3


def test_the_default_prompt_applies_on_classify_pairs_and_other_rerank_routes(
    server: Server, cross_encoders: dict[str, Any]
) -> None:
    query, documents = _pairs(seed=41)
    _, scores = cross_encoder_predict(cross_encoders["defaulted"], [(query, d) for d in documents])
    response = server.post(
        "/v1/classify", {"model": "defaulted", "input": [{"text": query, "text_pair": d} for d in documents]}
    )
    assert response.status_code == 200, response.text
    got = [r["score"] for r in sorted(response.json()["results"], key=lambda r: r["index"])]
    np.testing.assert_allclose(got, scores, atol=ATOL, rtol=0)
    # vLLM's /rerank carries no prompt field: the default applies there too.
    response = server.post("/rerank", {"model": "defaulted", "query": query, "documents": documents})
    assert response.status_code == 200, response.text
    vllm = {r["index"]: r["relevance_score"] for r in response.json()["results"]}
    np.testing.assert_allclose([vllm[i] for i in range(len(documents))], scores, atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    ("model", "extra", "status", "param"),
    [
        ("prompted", {"prompt_name": "nope"}, 422, "prompt_name"),
        ("plain", {"prompt_name": "query"}, 422, "prompt_name"),
        ("prompted", {"prompt_name": "query", "prompt": "x"}, 400, "prompt_name"),
        # Put into every pair: bounded in characters before any is tokenized.
        ("plain", {"prompt": "yes " * 2000}, 413, "prompt"),
        # A bi-encoder embeds the query and each document apart: no pair prompt applies.
        ("embedder", {"prompt": "x"}, 422, "prompt"),
        ("embedder", {"prompt_name": "query"}, 422, "prompt_name"),
    ],
)
def test_prompt_refusals_name_the_field(
    server: Server, model: str, extra: dict[str, str], status: int, param: str
) -> None:
    response = server.post("/v1/rerank", {"model": model, "query": "q", "documents": ["d"], **extra})
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == param
