"""chromadb's TEI and OpenAI embedding functions in real in-process collections
(`chromadb.EphemeralClient`), against `vllm-srun serve` on all-MiniLM-L6-v2 with only the
URL given.

Each collection embeds its documents on `add` and its query on `query` through the server.
In an l2 collection the vectors it stores equal /v1/embeddings' answer exactly (chromadb keeps
the float32 the server sent); a cosine collection (the functions' default space) keeps a copy
it normalises again itself, within the rounding of that (see `renormalised_within`). The distances it answers must be those of
our vectors (1e-6: chromadb computes them in float32).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from helpers import Server

chromadb = pytest.importorskip("chromadb")
from chromadb.config import Settings  # noqa: E402
from chromadb.utils.embedding_functions import (  # noqa: E402
    HuggingFaceEmbeddingServer,
    OpenAIEmbeddingFunction,
)

MODEL = "all-MiniLM-L6-v2"
DOCUMENTS = [
    "foxes live in dens in forests and grasslands",
    "invoices are due at the end of the month",
    "the quick brown fox jumps over the lazy dog",
    "Ελληνικά και русский текст",
]
QUERY = "where do foxes live"
DISTANCE = 1e-6  # chromadb's distances are float32


def renormalised_within(vectors: np.ndarray) -> float:
    """How far normalising float32 unit vectors again in float32 may move a component: their
    norm, a sum of n squares taken in order, is off by about sqrt(n) roundings (a random walk
    of float32 epsilons), which scales each component (at most the largest); and the scaled
    component is rounded once more."""
    eps = float(np.finfo(np.float32).eps)
    largest = float(np.abs(vectors).max())
    return largest * np.sqrt(vectors.shape[1]) * eps + float(np.spacing(np.float32(largest)))


@pytest.fixture(scope="module")
def server(minilm_server: Server) -> Server:
    return minilm_server


def ours(server: Server, texts: list[str]) -> np.ndarray:
    answer = server.post("/v1/embeddings", {"model": MODEL, "input": texts, "encoding_format": "float"})
    assert answer.status_code == 200, answer.text
    return np.asarray([d["embedding"] for d in answer.json()["data"]], dtype=np.float32)


def check_collection(name: str, function: Any, server: Server, space: str | None) -> None:
    """Add, get and query a collection of `space` (None: the function's default, cosine)."""
    client = chromadb.EphemeralClient(settings=Settings(anonymized_telemetry=False))
    metadata = {"hnsw:space": space} if space else None
    collection = client.create_collection(name, embedding_function=function, metadata=metadata)
    ids = [f"d{i}" for i in range(len(DOCUMENTS))]
    collection.add(ids=ids, documents=DOCUMENTS)
    stored = collection.get(ids=ids, include=["embeddings"])
    want = ours(server, DOCUMENTS)
    assert stored["ids"] == ids
    got = np.asarray(stored["embeddings"], dtype=np.float32)
    if space == "l2":
        assert np.array_equal(got, want)  # kept as sent
    else:
        # A cosine collection keeps its own unit-length copy, normalised again in float32.
        assert np.allclose(got, want, rtol=0, atol=renormalised_within(want)), np.abs(got - want).max()
    found = collection.query(query_texts=[QUERY], n_results=2, include=["distances", "documents"])
    query = ours(server, [QUERY])[0].astype(np.float64)
    vectors = want.astype(np.float64)
    cosine = vectors @ query / (np.linalg.norm(vectors, axis=1) * np.linalg.norm(query))
    distance = ((vectors - query) ** 2).sum(axis=1) if space == "l2" else 1.0 - cosine
    best = np.argsort(distance)[:2]
    assert found["ids"] == [[ids[i] for i in best]]
    assert found["documents"] == [[DOCUMENTS[i] for i in best]]
    assert found["distances"] is not None
    for got_distance, i in zip(found["distances"][0], best, strict=True):
        assert abs(got_distance - distance[i]) <= DISTANCE, (got_distance, distance[i])
    client.delete_collection(name)


@pytest.mark.parametrize("space", [None, "l2"])
def test_huggingface_embedding_server_collection_stores_v1_embeddings(
    server: Server, space: str | None
) -> None:
    """chromadb's TEI function posts `{inputs}` to the URL it is given: TEI's /embed."""
    function = HuggingFaceEmbeddingServer(url=f"{server.url}/embed")
    check_collection(f"tei-embed-{space}", function, server, space)


@pytest.mark.parametrize("space", [None, "l2"])
def test_openai_embedding_function_collection_stores_v1_embeddings(
    server: Server, space: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHROMA_OPENAI_API_KEY", "unused")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    function = OpenAIEmbeddingFunction(model_name=MODEL, api_base=f"{server.url}/v1")
    check_collection(f"openai-embeddings-{space}", function, server, space)
