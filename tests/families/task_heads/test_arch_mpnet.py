"""MPNet as all-mpnet-base-v2 ships it, and checkpoints as sentence-transformers packages ship
them, served over real HTTP and compared with `SentenceTransformer(path).encode` (cosine >=
0.99999 per text) on seeded random texts over the fixture vocabulary.

One server holds: the `mpnet-embedding` fixture (MPNetModel, mean pooling, a Normalize whose
`2_Normalize` folder is absent, as sentence-transformers saves it); MPNet and BERT packages
whose config.json names *ForMaskedLM / *ForPreTraining, saved by Transformers with their LM
heads in the weights (the encoder is served, the head ignored); and MPNet and BERT copies whose
sentence_bert_config.json sets max_seq_length below the position table (the model's limit,
where sentence-transformers truncates). Beside them, rerank by cosine and early-exit layers,
against sentence-transformers with its encoder cut to that many layers.
"""

from __future__ import annotations

import copy
import json
import shutil
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from compat.test_sentence_transformers import assert_close, embed
from families.task_heads.harness import random_texts
from helpers import Server, serve_named

from vllm_srun.testing.task_heads_fixtures import add_sentence_transformers, write_fixture

pytestmark = pytest.mark.torch

SHORT = 16  # max_seq_length of the truncating copies: well below the fixtures' 128 positions
# Shipped forms: (served name, fixture variant, class written into config.json, a tensor
# prefix only that class's head has).
SHIPPED = (
    ("mpnet-mlm", "mpnet-embedding", "MPNetForMaskedLM", "lm_head."),
    ("bert-mlm", "bert-embedding", "BertForMaskedLM", "cls.predictions."),
    ("bert-pretraining", "bert-embedding", "BertForPreTraining", "cls.seq_relationship."),
)


def _reshipped(out: Path, variant: str, architecture: str) -> Path:
    """The fixture `variant` saved again by Transformers as `architecture` (random weights,
    seeded), head and all, keeping its tokenizer and sentence-transformers modules."""
    import torch
    import transformers

    write_fixture(out, variant=variant)
    config = transformers.AutoConfig.from_pretrained(out)
    config.architectures = [architecture]
    torch.manual_seed(7)
    model = getattr(transformers, architecture)(config).eval()
    (out / "model.safetensors").unlink()
    model.save_pretrained(out, safe_serialization=True)
    return out


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("arch-mpnet")
    out = {"mpnet": write_fixture(root / "mpnet", variant="mpnet-embedding")}
    for name, variant, architecture, _ in SHIPPED:
        out[name] = _reshipped(root / name, variant, architecture)
    for name, source in (("mpnet-short", out["mpnet"]), ("bert-short", out["bert-mlm"])):
        out[name] = add_sentence_transformers(
            Path(shutil.copytree(source, root / name)), max_seq_length=SHORT
        )
    return out


@pytest.fixture(scope="module")
def server(module_server: Callable[..., Server], packages: dict[str, Path]) -> Server:
    return module_server(*serve_named(packages), "--threads", "1")


@pytest.fixture(scope="module")
def references(packages: dict[str, Path]) -> dict[str, Any]:
    from sentence_transformers import SentenceTransformer

    return {name: SentenceTransformer(str(path), device="cpu") for name, path in packages.items()}


def test_the_fixture_is_all_mpnet_base_v2s_form(packages: dict[str, Path]) -> None:
    path = packages["mpnet"]
    config = json.loads((path / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == ("mpnet", ["MPNetModel"])
    modules = [m["type"].rsplit(".", 1)[-1] for m in json.loads((path / "modules.json").read_text())]
    assert modules == ["Transformer", "Pooling", "Normalize"]
    assert json.loads((path / "1_Pooling" / "config.json").read_text())["pooling_mode_mean_tokens"]
    # modules.json names 2_Normalize; sentence-transformers writes no folder for it.
    assert not (path / "2_Normalize").exists()


@pytest.mark.parametrize("model", ["mpnet", *(name for name, *_ in SHIPPED)])
def test_random_texts_match_sentence_transformers(
    server: Server, references: dict[str, Any], model: str
) -> None:
    texts = random_texts(seed=zlib.crc32(model.encode()), count=24, max_words=40)
    got = embed(server, model, texts)
    assert_close(got, references[model].encode(texts))
    # Normalize ran without its folder: every vector is unit length.
    np.testing.assert_allclose([np.linalg.norm(v) for v in got], 1.0, atol=1e-6)


@pytest.mark.parametrize(("model", "_variant", "architecture", "head"), SHIPPED)
def test_shipped_class_carries_its_lm_head(
    packages: dict[str, Path], server: Server, model: str, _variant: str, architecture: str, head: str
) -> None:
    from safetensors import safe_open

    path = packages[model]
    assert json.loads((path / "config.json").read_text())["architectures"] == [architecture]
    with safe_open(str(path / "model.safetensors"), framework="pt") as weights:
        names = list(weights.keys())
    assert any(n.startswith(head) for n in names), names  # the head is there, and ignored
    cards = {card["id"]: card for card in server.get("/v1/models").json()["data"]}
    assert cards[model]["embedding"]["normalized"] is True


@pytest.mark.parametrize("model", ["mpnet-short", "bert-short"])
def test_max_seq_length_below_the_positions_truncates_there(
    server: Server, references: dict[str, Any], model: str
) -> None:
    reference = references[model]
    assert reference.max_seq_length == SHORT
    cards = {card["id"]: card for card in server.get("/v1/models").json()["data"]}
    assert cards[model]["max_tokens"] == SHORT
    long = random_texts(seed=99, count=6, max_words=60)
    long = [text for text in long if len(reference.tokenize([text])["input_ids"][0]) == SHORT]
    assert long, "no text long enough to be truncated"
    assert_close(embed(server, model, long, options={"overflow": "truncate"}), reference.encode(long))
    assert server.post("/v1/embeddings", {"model": model, "input": long}).status_code == 400
    # Short texts are the same model as the untruncated package.
    short = random_texts(seed=5, count=8, max_words=8)
    assert_close(embed(server, model, short), reference.encode(short))


def test_rerank_by_cosine_matches_sentence_transformers(server: Server, references: dict[str, Any]) -> None:
    query, *documents = random_texts(seed=21, count=9, max_words=20)
    response = server.post("/v1/rerank", {"model": "mpnet", "query": query, "documents": documents})
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    reference = references["mpnet"]
    vectors = reference.encode([query, *documents])
    want = vectors[1:] @ vectors[0] / (np.linalg.norm(vectors[1:], axis=1) * np.linalg.norm(vectors[0]))
    got = {r["index"]: r["relevance_score"] for r in results}
    assert sorted(got) == list(range(len(documents)))
    np.testing.assert_allclose([got[i] for i in range(len(documents))], want, atol=1e-5)
    assert [r["index"] for r in results] == sorted(got, key=lambda i: -got[i])


def _cut(reference: Any, layers: int) -> Any:
    """The sentence-transformers model with its encoder cut to the first `layers` layers: its
    output is Transformers' hidden_states[layers], pooled and normalised as the package says."""
    from torch import nn

    cut = copy.deepcopy(reference)
    encoder = cut[0].auto_model.encoder
    encoder.layer = nn.ModuleList(list(encoder.layer)[:layers])
    return cut


def test_early_exit_layers_match_a_cut_encoder(server: Server, references: dict[str, Any]) -> None:
    card = {card["id"]: card for card in server.get("/v1/models").json()["data"]}["mpnet"]
    layers = card["embedding"]["layers"]
    assert layers == [1, 2]  # the native engine exits after every layer of the 2-layer fixture
    texts = random_texts(seed=3, count=12, max_words=30)
    for layer in layers:
        want = _cut(references["mpnet"], layer).encode(texts)
        assert_close(embed(server, "mpnet", texts, layer=layer), want)
    early = embed(server, "mpnet", texts[:1], layer=1)[0]
    assert not np.allclose(early, embed(server, "mpnet", texts[:1])[0], atol=1e-3)
