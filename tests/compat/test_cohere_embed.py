"""Cohere's embed through the real `cohere` client (v1 `Client` and `ClientV2`) at the root.

The embedder is the tiny random-weight bert-embedding fixture with sentence-transformers
prompts for the query and document roles and for `classification`, so `input_type` changes
the vectors; each vector is compared with /v1/embeddings' for the same text and prompt,
exactly (the same float32 through JSON both ways). tests/legacy_clients runs cohere 5 and
langchain-cohere against the same routes.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import cohere
import httpx
import numpy as np
import pytest
from helpers import Server, ok

from vllm_srun.testing.task_heads_fixtures import write_fixture

MODEL = "embedder"
TEXTS = ["where do foxes live", "invoices are due at the end of the month", "a"]
PROMPTS = {"query": "query: ", "document": "passage: ", "classification": "classify: "}


@pytest.fixture(scope="module")
def server(module_server: Callable[..., Server], tmp_path_factory: pytest.TempPathFactory) -> Server:
    package = write_fixture(tmp_path_factory.mktemp("cohere-embed") / "embed", variant="bert-embedding")
    (package / "config_sentence_transformers.json").write_text(json.dumps({"prompts": PROMPTS}))
    return module_server(str(package), "--served-model-name", MODEL, "embed-english-v3.0")


@pytest.fixture(scope="module")
def v1(server: Server) -> cohere.Client:
    return cohere.Client(base_url=server.url, api_key="x", timeout=30)


@pytest.fixture(scope="module")
def v2(server: Server) -> cohere.ClientV2:
    return cohere.ClientV2(base_url=server.url, api_key="x", timeout=30)


def ours(server: Server, texts: list[str], **extra: Any) -> list[list[float]]:
    body = ok(server, "/v1/embeddings", {"model": MODEL, "input": texts, **extra})
    return [item["embedding"] for item in body["data"]]


def test_v1_embed_is_v1_embeddings(v1: cohere.Client, server: Server) -> None:
    answer = v1.embed(texts=TEXTS, model=MODEL)
    assert answer.response_type == "embeddings_floats"
    assert answer.embeddings == ours(server, TEXTS) and answer.texts == TEXTS
    assert answer.meta is not None and answer.meta.api_version is not None
    assert answer.meta.api_version.version == "1"
    usage = ok(server, "/v1/embeddings", {"input": TEXTS})["usage"]
    assert answer.meta.billed_units is not None
    assert answer.meta.billed_units.input_tokens == usage["prompt_tokens"]
    by_type = v1.embed(texts=TEXTS, model=MODEL, embedding_types=["float"])
    assert by_type.response_type == "embeddings_by_type"
    assert by_type.embeddings.float_ == answer.embeddings


def test_v2_embed_is_v1_embeddings_with_the_roles_prompt(v2: cohere.ClientV2, server: Server) -> None:
    for input_type, fields in [
        ("search_query", {"input_type": "query"}),
        ("search_document", {"input_type": "document"}),
        ("classification", {"prompt_name": "classification"}),
        ("clustering", {}),  # the package has no such prompt: the text as it is
    ]:
        answer = v2.embed(texts=TEXTS, model=MODEL, input_type=input_type, embedding_types=["float"])
        assert answer.embeddings.float_ == ours(server, TEXTS, **fields), input_type
        assert answer.meta is not None and answer.meta.api_version is not None
        assert answer.meta.api_version.version == "2"
    assert ours(server, TEXTS, input_type="query") != ours(server, TEXTS)
    # An alias reaches the model; embedding_types defaults to float; output_dimension is dimensions.
    default = v2.embed(texts=TEXTS, model="embed-english-v3.0", input_type="clustering")
    assert default.embeddings.float_ == ours(server, TEXTS)
    short = v2.embed(texts=TEXTS, model=MODEL, input_type="clustering", output_dimension=8)
    assert short.embeddings.float_ == ours(server, TEXTS, dimensions=8)


def test_truncate_is_cohere_s(v1: cohere.Client, v2: cohere.ClientV2, server: Server) -> None:
    long = " ".join(["fox"] * 300)  # past the fixture's 128 tokens
    end = v2.embed(texts=[long], model=MODEL, input_type="clustering")  # END, Cohere's default
    assert end.embeddings.float_ == ours(server, [long], options={"overflow": "truncate"})
    # null is the default, as Cohere's clients send an unset truncate (langchain-cohere does).
    body = {"texts": [long], "model": MODEL, "truncate": None, "input_type": None, "embedding_types": None}
    null = httpx.post(f"{server.url}/v1/embed", json=body, timeout=30)
    assert null.status_code == 200 and null.json()["embeddings"] == end.embeddings.float_, null.text
    start = v2.embed(texts=[long, "a"], model=MODEL, input_type="clustering", truncate="START")
    left = {"overflow": "truncate", "truncation_direction": "left"}
    assert start.embeddings.float_ == ours(server, [long, "a"], options=left)
    with pytest.raises(cohere.BadRequestError) as refused:
        v1.embed(texts=["a", long], model=MODEL, truncate="NONE")
    assert "texts[1]" in str(refused.value.body) and "(send truncate: END or START)" in str(
        refused.value.body
    )
    # Truncation reads a bounded number of characters: past it, the refusal names Cohere's field.
    huge = httpx.post(f"{server.url}/v2/embed", json={"texts": ["fox " * 5000], "max_tokens": 1}, timeout=30)
    assert huge.status_code == 413 and "under truncate END or START" in huge.text, huge.text
    assert "options" not in huge.json()["error"]["message"]
    capped = v2.embed(texts=[TEXTS[1]], model=MODEL, input_type="clustering", max_tokens=4)
    assert capped.embeddings.float_ == ours(
        server, [TEXTS[1]], options={"overflow": "truncate", "max_tokens": 4}
    )
    assert capped.embeddings.float_ != ours(server, [TEXTS[1]])


def test_embedding_types_are_sentence_transformers_quantize_embeddings(
    v1: cohere.Client, v2: cohere.ClientV2, server: Server
) -> None:
    """Several types at once, on v1 and v2, each equal to `quantize_embeddings` of the float
    vectors (int8 and uint8 on the calibration ranges /v1/models shows), bit for bit."""
    reference = pytest.importorskip("sentence_transformers.util.quantization").quantize_embeddings
    kinds = ["float", "int8", "uint8", "binary", "ubinary", "base64"]
    for client in (v1, v2):
        answer = client.embed(texts=TEXTS, model=MODEL, input_type="search_query", embedding_types=kinds)
        by_type = answer.embeddings
        floats = np.asarray(ours(server, TEXTS, input_type="query"), dtype=np.float32)
        assert by_type.float_ == floats.tolist()
        (card,) = server.get("/v1/models").json()["data"]
        ranges = np.asarray(card["quantization"]["calibration"]["ranges"], dtype=np.float32)
        for kind in ("int8", "uint8", "binary", "ubinary"):
            expected = reference(floats, precision=kind, ranges=ranges if "int8" in kind else None)
            assert np.array_equal(np.asarray(getattr(by_type, kind)), expected), kind
        decoded = [np.frombuffer(base64.b64decode(b), dtype="<f4") for b in by_type.base64 or []]
        assert np.array_equal(np.stack(decoded), floats)
    # Only the types asked for come back; output_dimension applies to them too.
    short = v2.embed(
        texts=TEXTS, model=MODEL, input_type="clustering", embedding_types=["ubinary"], output_dimension=16
    )
    assert short.embeddings.float_ is None and short.embeddings.int8 is None
    assert np.array_equal(
        np.asarray(short.embeddings.ubinary),
        reference(np.asarray(ours(server, TEXTS, dimensions=16)), precision="ubinary"),
    )


def test_bad_input_raises_the_client_s_errors(v1: cohere.Client, v2: cohere.ClientV2, server: Server) -> None:
    with pytest.raises(cohere.BadRequestError):
        v2.embed(texts=TEXTS, model=MODEL, input_type="search_query", embedding_types=["int4"])
    with pytest.raises(cohere.BadRequestError):
        v2.embed(texts=[], model=MODEL, input_type="search_query")
    with pytest.raises(cohere.BadRequestError):
        v2.embed(texts=TEXTS, model=MODEL, input_type="image")
    with pytest.raises(cohere.NotFoundError):
        v1.embed(texts=TEXTS, model="embed-multilingual-v3.0")
    # Accepted and without effect here.
    assert v2.embed(texts=TEXTS, model=MODEL, input_type="clustering", priority=1).embeddings.float_
    refused = httpx.post(f"{server.url}/v2/embed", json={"texts": ["a"], "images": ["x"]}, timeout=30)
    assert refused.status_code == 400 and "images" in refused.text


def test_refusals_name_cohere_s_fields(server: Server) -> None:
    """A refusal of what the surface calls options.max_tokens, dimensions or input names the
    Cohere body's own field: max_tokens, output_dimension, texts."""
    for body, status, param in (
        ({"texts": ["a"], "max_tokens": 100_000}, 422, "max_tokens"),
        ({"texts": ["a"], "output_dimension": 100_000}, 422, "output_dimension"),
        ({"texts": ["a"] * 2049}, 413, "texts"),  # past --max-inputs' default, 2048
        ({"texts": ["a", "fox " * 5000], "max_tokens": 1}, 413, "texts[1]"),  # the character bound
    ):
        refused = httpx.post(f"{server.url}/v2/embed", json={"model": MODEL, **body}, timeout=30)
        error = refused.json()["error"]
        assert refused.status_code == status and error["param"] == param, (param, refused.text)
        assert error["message"].startswith(f"{param}: "), error
