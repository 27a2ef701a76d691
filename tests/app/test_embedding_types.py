"""`options.embedding_type` on /v1/embeddings over HTTP: int8, uint8, binary and ubinary equal
sentence-transformers' `quantize_embeddings` of the served float vectors, int8 and uint8 on the
calibration ranges /v1/models shows, which are the corpus' own; the result cache never answers
one type for another; bad input names its field.

The embedder is the tiny random-weight bert-embedding fixture (it normalises). Comparisons are
exact: the float vectors come through JSON as the float32 values the server quantized (a
float32 is exact in a JSON double), and the reference computes the same float32 expressions.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest
from helpers import Server, ok

from vllm_srun.app.embedding_types import CALIBRATION_SEED, CALIBRATION_TEXTS
from vllm_srun.plugins.embedding_types import ranges_of
from vllm_srun.registry.corpus import corpus

quantization = pytest.importorskip("sentence_transformers.util.quantization")
reference = quantization.quantize_embeddings

MAX_INPUTS = 64
TEXTS = ["where do foxes live", "invoices are due at the end of the month", "a", "the river in spring"]


@pytest.fixture(scope="module")
def server(module_server: Callable[..., Server], tmp_path_factory: pytest.TempPathFactory) -> Server:
    pytest.importorskip("torch")
    from vllm_srun.testing.task_heads_fixtures import write_fixture

    package = write_fixture(tmp_path_factory.mktemp("embedding-types") / "embed", variant="bert-embedding")
    # Fewer inputs per request than the calibration corpus holds: the server sends it in parts.
    return module_server(str(package), "--served-model-name", "embedder", "--max-inputs", str(MAX_INPUTS))


def embed(server: Server, texts: list[str], **extra: Any) -> list[Any]:
    body = ok(server, "/v1/embeddings", {"input": texts, **extra})
    return [item["embedding"] for item in body["data"]]


def floats(server: Server, texts: list[str], **extra: Any) -> np.ndarray:
    return np.asarray(embed(server, texts, **extra), dtype=np.float32)


def typed(server: Server, texts: list[str], kind: str, **extra: Any) -> np.ndarray:
    options = {**extra.pop("options", {}), "embedding_type": kind}
    return np.asarray(embed(server, texts, options=options, **extra))


def card_ranges(server: Server) -> np.ndarray:
    (card,) = server.get("/v1/models").json()["data"]
    calibration = card["quantization"]["calibration"]
    assert calibration["texts"] == CALIBRATION_TEXTS and calibration["seed"] == CALIBRATION_SEED
    return np.asarray(calibration["ranges"], dtype=np.float32)


def corpus_vectors(server: Server, **extra: Any) -> np.ndarray:
    texts = corpus(CALIBRATION_TEXTS, seed=CALIBRATION_SEED)
    parts = [texts[i : i + MAX_INPUTS] for i in range(0, len(texts), MAX_INPUTS)]
    return np.concatenate([floats(server, part, options={"overflow": "truncate"}, **extra) for part in parts])


@pytest.mark.parametrize("kind", ["binary", "ubinary"])
def test_binary_types_are_the_reference_bit_for_bit(server: Server, kind: str) -> None:
    ours = typed(server, TEXTS, kind)
    theirs = reference(floats(server, TEXTS), precision=kind)
    assert ours.shape == theirs.shape and np.array_equal(ours, theirs)


def test_integer_types_use_the_calibration_ranges_the_card_shows(server: Server) -> None:
    int8 = typed(server, TEXTS, "int8")  # the first int8 request computes the ranges
    uint8 = typed(server, TEXTS, "uint8")
    ranges = card_ranges(server)
    # The ranges are the calibration corpus' own, embedded as any request is.
    assert np.array_equal(ranges, ranges_of(corpus_vectors(server)))
    served = floats(server, TEXTS)
    assert np.array_equal(int8, reference(served, precision="int8", ranges=ranges))
    assert np.array_equal(uint8, reference(served, precision="uint8", ranges=ranges))
    # A text's values are its own, whatever it is sent with.
    assert np.array_equal(typed(server, TEXTS[:1], "int8")[0], int8[0])
    assert int8.min() >= -128 and int8.max() <= 127 and uint8.min() >= 0 and uint8.max() <= 255


def test_fewer_dimensions_take_the_calibration_s_leading_components(server: Server) -> None:
    leading = corpus_vectors(server)[:, :8].astype(np.float64)
    # The fixture normalises: the leading components are renormalised, as the served ones are.
    ranges = ranges_of(leading / np.linalg.norm(leading, axis=1, keepdims=True))
    served = floats(server, TEXTS, dimensions=8)
    ours = typed(server, TEXTS, "uint8", dimensions=8)
    assert ours.shape == (len(TEXTS), 8)
    assert np.array_equal(ours, reference(served, precision="uint8", ranges=ranges))


def test_base64_is_the_values_as_float32_as_openai_decodes_it(server: Server) -> None:
    for kind in ("int8", "ubinary"):
        values = typed(server, TEXTS, kind)
        encoded = embed(server, TEXTS, encoding_format="base64", options={"embedding_type": kind})
        decoded = [np.frombuffer(base64.b64decode(e), dtype="<f4") for e in encoded]
        assert np.array_equal(np.stack(decoded), values), kind


def test_the_openai_client_reads_quantized_values(server: Server) -> None:
    """The openai package asks for base64 unless told otherwise and decodes it as float32: a
    quantized type reaches it as its integer values."""
    import openai

    client = openai.OpenAI(api_key="unused", base_url=server.url + "/v1", max_retries=0)
    for kind in ("int8", "binary"):
        made = client.embeddings.create(
            model="embedder", input=TEXTS, extra_body={"options": {"embedding_type": kind}}
        )
        assert np.array_equal(np.asarray([d.embedding for d in made.data]), typed(server, TEXTS, kind)), kind


def test_the_cache_never_answers_one_type_for_another(server: Server) -> None:
    """A float request then an int8 one for the same new text, and the other way round: the
    second is a cache hit on the float work, and still answers its own type."""
    for first, second in (("float", "int8"), ("binary", "float")):
        text = [f"a text only the {first} then {second} order sends"]
        one = embed(server, text, options={"embedding_type": first})[0]
        answer = ok(
            server,
            "/v1/embeddings",
            {"input": text, "options": {"embedding_type": second, "return_meta": True}},
        )
        assert answer["meta"]["cache"]["hits"] == 1, answer["meta"]
        two = answer["data"][0]["embedding"]
        vector = one if first == "float" else two
        quantized = two if first == "float" else one
        assert len(vector) == 32 and any(v != round(v) for v in vector), vector
        assert all(isinstance(v, int) for v in quantized), quantized
        assert embed(server, text)[0] == vector


def test_bad_embedding_types_name_the_field(server: Server) -> None:
    """A type the document does not list is a malformed request (400, as any value outside a
    field's enum), and so is a dense-only option given with another output, as the other
    fields that shape a dense vector are; a job, which answers floats, refuses the option."""
    unknown = server.post("/v1/embeddings", {"input": ["a"], "options": {"embedding_type": "int4"}})
    assert unknown.status_code == 400, unknown.text
    assert unknown.json()["error"]["param"] == "options.embedding_type"
    tokens = server.post(
        "/v1/embeddings", {"input": ["a"], "options": {"embedding_type": "int8", "output": "tokens"}}
    )
    assert tokens.status_code == 400, tokens.text
    assert tokens.json()["error"]["param"] == "options.embedding_type"
    job = httpx.post(
        f"{server.url}/v1/jobs",
        json={"surface": "embeddings", "requests": [{"input": ["a"], "options": {"embedding_type": "int8"}}]},
        timeout=30,
    )
    assert job.status_code == 400 and "options.embedding_type" in job.text, job.text
