"""OpenAI's embeddings API through the real `openai` client against `vllm-srun serve` on
all-MiniLM-L6-v2, numbers against sentence-transformers (cosine >= 0.99999 per text).

The client's default base64 encoding, floats, `dimensions`, token-id inputs, `user`; an input
over the model's 256-token limit raises `openai.BadRequestError` naming `input[i]` (never a
200 with a null vector) unless truncation is asked for per request (`options.overflow`) or per
deployment (`serve --auto-truncate`), and a truncated input still reports `input.truncated`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import openai
import pytest
from helpers import Server, minilm_dir

MODEL = "all-MiniLM-L6-v2"
COSINE = 0.99999
TEXTS = ["A man is eating food.", "The new movie is awesome", "Ελληνικά και русский текст", "a"]
# About 390 tokens: past the package's max_seq_length of 256.
LONG = " ".join(f"sentence number {i} talks about retrieval, embeddings and search." for i in range(28))


@pytest.fixture(scope="module")
def reference() -> Any:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_dir()), device="cpu")


def expected(reference: Any, texts: list[str]) -> np.ndarray:
    out: np.ndarray = reference.encode(texts, convert_to_numpy=True)
    return out


@pytest.fixture(scope="module")
def server(minilm_server: Server) -> Server:
    return minilm_server


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)


def assert_close(vectors: list[list[float]], want: np.ndarray) -> None:
    assert len(vectors) == len(want)
    for got, ref in zip(vectors, want, strict=True):
        got_v = np.asarray(got, dtype=np.float64)
        cosine = float(got_v @ ref) / float(np.linalg.norm(got_v) * np.linalg.norm(ref))
        assert cosine >= COSINE, cosine


def test_default_base64_and_floats_equal_sentence_transformers(
    client: openai.OpenAI, server: Server, reference: Any
) -> None:
    want = expected(reference, TEXTS)
    default = client.embeddings.create(model=MODEL, input=TEXTS)  # the client asks for base64
    assert_close([d.embedding for d in default.data], want)
    floats = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float", user="u-1")
    assert_close([d.embedding for d in floats.data], want)
    assert [d.index for d in floats.data] == list(range(len(TEXTS)))
    assert floats.usage.prompt_tokens == sum(len(reference.tokenize([t])["input_ids"][0]) for t in TEXTS)
    one = client.embeddings.create(model=MODEL, input=TEXTS[0], encoding_format="float")
    assert_close([one.data[0].embedding], want[:1])


def test_dimensions_cut_and_renormalise(client: openai.OpenAI, reference: Any) -> None:
    want = expected(reference, TEXTS)[:, :128]
    got = client.embeddings.create(model=MODEL, input=TEXTS, dimensions=128)
    assert all(len(d.embedding) == 128 for d in got.data)
    assert_close([d.embedding for d in got.data], want)
    assert all(abs(float(np.linalg.norm(d.embedding)) - 1.0) < 1e-5 for d in got.data)


def test_token_ids_are_taken_as_given(client: openai.OpenAI, reference: Any) -> None:
    ids = [[int(i) for i in reference.tokenize([t])["input_ids"][0]] for t in TEXTS]
    want = expected(reference, TEXTS)
    got = client.embeddings.create(model=MODEL, input=ids)
    assert_close([d.embedding for d in got.data], want)
    one = client.embeddings.create(model=MODEL, input=ids[1])
    assert_close([one.data[0].embedding], want[1:2])
    with pytest.raises(openai.UnprocessableEntityError) as error:  # the model's vocabulary: 422
        client.embeddings.create(model=MODEL, input=[ids[0], [101, 10**6, 102]])
    assert error.value.param == "input[1]" and "vocabulary" in error.value.message


def test_overlong_input_is_a_bad_request_naming_it(client: openai.OpenAI, server: Server) -> None:
    with pytest.raises(openai.BadRequestError) as error:
        client.embeddings.create(model=MODEL, input=["short", LONG])
    assert error.value.param == "input[1]"
    assert "256" in error.value.message and "tokens" in error.value.message
    body = error.value.body
    assert isinstance(body, dict) and body["code"] == "invalid_request"
    assert body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as single:
        client.embeddings.create(model=MODEL, input=LONG)
    assert single.value.param == "input"
    # The upstream runtime's form: an explicit reject answers that input in place.
    raw = server.post(
        "/v1/embeddings",
        {"model": MODEL, "input": ["short", LONG], "options": {"overflow": "reject"}},
    )
    assert raw.status_code == 200
    data = raw.json()["data"]
    assert data[1]["error"] == "max_length_exceeded" and data[0]["embedding"]
    assert "tokens" in data[1]["message"]


def test_truncation_per_request_matches_sentence_transformers(client: openai.OpenAI, reference: Any) -> None:
    texts = ["short", LONG]
    got = client.embeddings.create(
        model=MODEL, input=texts, encoding_format="float", extra_body={"options": {"overflow": "truncate"}}
    )
    assert_close([d.embedding for d in got.data], expected(reference, texts))
    info = (got.data[1].model_extra or {})["input"]
    assert info["truncated"] is True and info["processed_tokens"] == 256 and info["tokens"] > 256


def test_auto_truncate_deployment(module_server: Callable[..., Server], reference: Any) -> None:
    server = module_server(str(minilm_dir()), "--served-model-name", MODEL, "--auto-truncate")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    got = client.embeddings.create(model=MODEL, input=[LONG], encoding_format="float")
    assert_close([got.data[0].embedding], expected(reference, [LONG]))
    assert (got.data[0].model_extra or {})["input"]["truncated"] is True
    # A request that names reject keeps its per-item error even here.
    raw = server.post("/v1/embeddings", {"model": MODEL, "input": [LONG], "options": {"overflow": "reject"}})
    assert raw.json()["data"][0]["error"] == "max_length_exceeded"
    assert server.get("/v1/models").json()["data"][0]["max_tokens"] == 256


def test_a_third_party_family_never_answers_a_null_vector(
    module_server: Callable[..., Server], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The example plugin answers an over-long input as a per-item error; the OpenAI route
    turns that into the request's 400 naming the input, unless per-item errors are asked for."""
    from helpers import write_keywords

    package = write_keywords(tmp_path_factory.mktemp("short") / "kw", variant="short")
    server = module_server(str(package), "--served-model-name", "kw")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    ok = client.embeddings.create(model="kw", input=["refund", "parcel"], encoding_format="float")
    assert all(item.embedding for item in ok.data)
    with pytest.raises(openai.BadRequestError) as raised:
        client.embeddings.create(model="kw", input=["refund", "refund parcel invoice refund parcel refund"])
    body = raised.value.body
    assert isinstance(body, dict)
    assert body.get("param") == "input[1]" and body.get("code") == "invalid_request"
    # Asked for explicitly, the per-item error stays (our own clients read it).
    import httpx

    explicit = httpx.post(
        f"{server.url}/v1/embeddings",
        json={
            "model": "kw",
            "input": ["refund", "refund parcel invoice refund parcel refund"],
            "options": {"overflow": "reject"},
        },
    )
    assert explicit.status_code == 200
    assert explicit.json()["data"][1]["error"] == "max_length_exceeded"
