"""langchain-huggingface 1.2's HuggingFaceEndpointEmbeddings with the workaround in docs/coming-from/tei.md.

It refuses a URL as `model` before any request: it is given a repository id, and its clients
are pointed at the server (`emb.client = InferenceClient(base_url=URL)`, and the async one for
`aembed_*`). It then posts feature extraction to `POST /`; its vectors are exactly the route's
and /v1/embeddings' (float32 through JSON both ways), as docs/coming-from/tei.md says.
"""

from __future__ import annotations

import numpy as np
import pydantic
import pytest
from conftest import Server
from huggingface_hub import AsyncInferenceClient, InferenceClient
from langchain_huggingface import HuggingFaceEndpointEmbeddings

TEXTS = ["A man is eating food.", "The new movie is awesome", "Das ist ein Beispielsatz."]
QUERY = "what is the man eating"


def pointed_at(server: Server, **kwargs: object) -> HuggingFaceEndpointEmbeddings:
    emb = HuggingFaceEndpointEmbeddings(model="sentence-transformers/all-MiniLM-L6-v2", **kwargs)
    emb.client = InferenceClient(base_url=server.url)
    emb.async_client = AsyncInferenceClient(base_url=server.url)
    return emb


def surface_vectors(server: Server, texts: list[str]) -> np.ndarray:
    body = server.post("/v1/embeddings", {"input": texts})
    return np.asarray([item["embedding"] for item in body["data"]], dtype=np.float64)


def test_a_url_is_refused_by_the_client_itself(minilm: Server) -> None:
    with pytest.raises(pydantic.ValidationError, match="must be a HuggingFace repo ID, not a URL"):
        HuggingFaceEndpointEmbeddings(model=minilm.url)


def test_documents_and_query_are_the_embeddings_surface(minilm: Server) -> None:
    emb = pointed_at(minilm)
    documents = np.asarray(emb.embed_documents(TEXTS))
    assert documents.shape == (len(TEXTS), 384)
    np.testing.assert_array_equal(
        documents, np.asarray(minilm.post("/", {"inputs": TEXTS}), dtype=np.float32)
    )
    np.testing.assert_array_equal(documents, surface_vectors(minilm, TEXTS).astype(np.float32))
    query = np.asarray(emb.embed_query(QUERY))
    np.testing.assert_array_equal(query, surface_vectors(minilm, [QUERY])[0].astype(np.float32))


def test_model_kwargs_reach_teis_route(minilm: Server) -> None:
    emb = pointed_at(minilm, model_kwargs={"normalize": False})
    raw = np.asarray(emb.embed_documents(TEXTS))
    expected = minilm.post("/embed", {"inputs": TEXTS, "normalize": False})
    np.testing.assert_array_equal(raw, np.asarray(expected, dtype=np.float32))
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0, atol=1e-3)


async def _both(emb: HuggingFaceEndpointEmbeddings) -> tuple[list[list[float]], list[float]]:
    return await emb.aembed_documents(TEXTS), await emb.aembed_query(QUERY)


def test_async_embeddings_equal_the_sync_ones(minilm: Server) -> None:
    import asyncio

    emb = pointed_at(minilm)
    documents, query = asyncio.run(_both(emb))
    assert documents == emb.embed_documents(TEXTS)
    assert query == emb.embed_query(QUERY)
