"""`SentenceTransformer.encode` is the reference for sentence-transformers packages served by
`vllm-srun serve`: cosine >= 0.99999 per text, over real HTTP.

One server, three packages: all-MiniLM-L6-v2 as shipped (short texts, and texts past its
256-token max_seq_length with truncation on); a copy whose config_sentence_transformers.json
adds prompts with a default; and a copy with the same prompts whose Pooling leaves the prompt
out (include_prompt false) and which has a Dense module before its Normalize.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import Server, minilm_dir, serve_named

from vllm_srun.testing.task_heads_fixtures import add_sentence_transformers

COSINE = 0.99999
PROMPTS = {"query": "query: ", "document": "passage: "}
TEXTS = [
    "A man is eating food.",
    "Das ist ein Beispielsatz auf Deutsch, mit Umlauten: äöü ß.",
    "东京は日本の首都です。",
    "    leading and trailing spaces    ",
    "a",
]
LONG = [
    " ".join(f"sentence number {i} talks about retrieval, embeddings and search." for i in range(28)),
    "word " * 255,  # 255 words and two special tokens: one past the limit
    "word " * 254,  # exactly at the limit
]


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("st-packages")
    prompted = Path(shutil.copytree(minilm_dir(), root / "prompted"))
    add_sentence_transformers(prompted, prompts=PROMPTS, default_prompt_name="query")
    dense = Path(shutil.copytree(minilm_dir(), root / "dense"))
    add_sentence_transformers(
        dense, prompts=PROMPTS, default_prompt_name="query", include_prompt=False, dense_features=96
    )
    return {"minilm": minilm_dir(), "prompted": prompted, "dense": dense}


@pytest.fixture(scope="module")
def server(module_server: Callable[..., Server], packages: dict[str, Path]) -> Server:
    return module_server(*serve_named(packages))


@pytest.fixture(scope="module")
def references(packages: dict[str, Path]) -> dict[str, Any]:
    from sentence_transformers import SentenceTransformer

    return {name: SentenceTransformer(str(path), device="cpu") for name, path in packages.items()}


def embed(server: Server, model: str, texts: list[str], **extra: Any) -> list[np.ndarray]:
    response = server.post("/v1/embeddings", {"model": model, "input": texts, **extra})
    assert response.status_code == 200, response.text
    return [np.asarray(d["embedding"], dtype=np.float64) for d in response.json()["data"]]


def assert_close(got: list[np.ndarray], want: np.ndarray) -> None:
    assert len(got) == len(want)
    for vector, ref in zip(got, want, strict=True):
        assert vector.shape == ref.shape
        cosine = float(vector @ ref) / float(np.linalg.norm(vector) * np.linalg.norm(ref))
        assert cosine >= COSINE, cosine


def test_minilm_short_and_truncated_texts(server: Server, references: dict[str, Any]) -> None:
    reference = references["minilm"]
    assert reference.max_seq_length == 256
    assert_close(embed(server, "minilm", TEXTS), reference.encode(TEXTS))
    truncate = {"options": {"overflow": "truncate"}}
    assert_close(embed(server, "minilm", LONG, **truncate), reference.encode(LONG))
    # Without truncation the over-long ones are a 400 and the one at the limit is served.
    assert server.post("/v1/embeddings", {"model": "minilm", "input": LONG}).status_code == 400
    assert_close(embed(server, "minilm", LONG[2:]), reference.encode(LONG[2:]))
    models = {m["id"]: m for m in server.get("/v1/models").json()["data"]}
    assert models["minilm"]["max_tokens"] == 256
    assert models["minilm"]["embedding"]["similarity_fn_name"] == "cosine"


@pytest.mark.parametrize("model", ["prompted", "dense"])
def test_prompts_match_encode_with_the_same_prompt(
    server: Server, references: dict[str, Any], model: str
) -> None:
    reference = references[model]
    # The package's default prompt ("query") applies when the request names none.
    assert_close(embed(server, model, TEXTS), reference.encode(TEXTS))
    document = reference.encode(TEXTS, prompt_name="document")
    assert_close(embed(server, model, TEXTS, prompt_name="document"), document)
    assert_close(embed(server, model, TEXTS, input_type="document"), document)
    raw = reference.encode(TEXTS, prompt="Represent this sentence: ")
    assert_close(embed(server, model, TEXTS, prompt="Represent this sentence: "), raw)
    truncate = {"options": {"overflow": "truncate"}}
    assert_close(embed(server, model, LONG, **truncate), reference.encode(LONG))
    unknown = server.post("/v1/embeddings", {"model": model, "input": "x", "prompt_name": "qa"})
    assert unknown.status_code == 422  # the package's prompts: the model's refusal
    assert unknown.json()["error"]["param"] == "prompt_name"
    assert "'query', 'document'" in unknown.json()["error"]["message"]


def test_dense_module_sets_the_dimension(server: Server, references: dict[str, Any]) -> None:
    models = {m["id"]: m for m in server.get("/v1/models").json()["data"]}
    assert models["dense"]["embedding"]["dimension"] == 96
    assert references["dense"].get_embedding_dimension() == 96
    # The prompt is left out of pooling, so a prompted and an unprompted vector differ less
    # than they do with the prompt pooled in, but they still differ (the prompt is attended to).
    with_prompt = embed(server, "dense", ["hello"])[0]
    without = embed(server, "dense", ["hello"], prompt="")[0]
    assert not np.allclose(with_prompt, without)
