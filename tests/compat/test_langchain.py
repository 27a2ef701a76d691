"""langchain-openai's OpenAIEmbeddings through the real package against `vllm-srun serve` on
all-MiniLM-L6-v2, with the base URL and `check_embedding_ctx_length=False` given.

Vectors against /v1/embeddings' answer for the same texts, exactly (the client's base64 and
JSON carry the same float32). Without `check_embedding_ctx_length=False` the client splits
every text with tiktoken's OpenAI vocabulary (downloading its table first, which fails
offline) and sends those token ids instead of the text: the server takes token ids as the
model's own, as OpenAI's API does, so the vectors are of other tokens. The last test shows
that with a tiktoken encoding built here (the download is not possible in the suite).

langchain-huggingface (it needs huggingface_hub < 2) and langchain-cohere (cohere < 6) cannot
share this venv with huggingface_hub 2 and cohere 7: tests/legacy_clients runs them in a venv
of their own (`bash .ci/legacy_clients`).
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from helpers import Server

pytest.importorskip("langchain_openai")
import tiktoken
from langchain_openai import OpenAIEmbeddings

MODEL = "all-MiniLM-L6-v2"
TEXTS = [
    "A man is eating food.",
    "the quick brown fox jumps over the lazy dog",
    "Ελληνικά και русский текст",
    "a",
]


@pytest.fixture(scope="module")
def server(minilm_server: Server) -> Server:
    return minilm_server


def ours(server: Server, inputs: list[str] | list[list[int]], **extra: object) -> np.ndarray:
    body = {"model": MODEL, "input": inputs, "encoding_format": "float", **extra}
    answer = server.post("/v1/embeddings", body)
    assert answer.status_code == 200, answer.text
    return np.asarray([d["embedding"] for d in answer.json()["data"]], dtype=np.float64)


def client(server: Server, **kwargs: object) -> OpenAIEmbeddings:
    return OpenAIEmbeddings(
        model=MODEL,
        base_url=f"{server.url}/v1",
        api_key="unused",
        max_retries=0,
        **kwargs,
    )


def test_embeddings_without_the_length_check_equal_v1_embeddings(server: Server) -> None:
    embeddings = client(server, check_embedding_ctx_length=False, chunk_size=3)  # two requests
    want = ours(server, TEXTS)
    assert np.array_equal(np.asarray(embeddings.embed_documents(TEXTS)), want)
    assert np.array_equal(np.asarray(embeddings.embed_query(TEXTS[1])), want[1])
    assert np.array_equal(np.asarray(asyncio.run(embeddings.aembed_documents(TEXTS))), want)


def test_dimensions_equal_v1_embeddings_cut(server: Server) -> None:
    embeddings = client(server, check_embedding_ctx_length=False, dimensions=128)
    got = np.asarray(embeddings.embed_documents(TEXTS))
    assert got.shape == (len(TEXTS), 128)
    assert np.array_equal(got, ours(server, TEXTS, dimensions=128))


def test_the_default_length_check_sends_tiktoken_ids_not_the_text(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client's default: each text becomes tiktoken ids (here a byte-level encoding, as
    the OpenAI table cannot be downloaded in the suite), embedded as the model's ids."""
    encoding = tiktoken.Encoding(
        name="bytes",
        pat_str=r"\S+|\s+",
        mergeable_ranks={bytes([b]): b for b in range(256)},
        special_tokens={},
    )
    monkeypatch.setattr(tiktoken, "encoding_for_model", lambda name: encoding)
    got = np.asarray(client(server).embed_documents(TEXTS[:2]))
    ids = [list(text.encode()) for text in TEXTS[:2]]
    # The client averages a text's chunks and normalises that again (float64): 1e-6.
    assert np.allclose(got, ours(server, ids), rtol=0, atol=1e-6)
    assert not np.allclose(got, ours(server, TEXTS[:2]), atol=1e-2)
