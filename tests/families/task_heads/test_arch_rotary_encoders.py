"""NomicBERT and GTE packages served through the task_heads family, against their references.

Embedders (`nomic-bert-embedding` pools by mean as nomic-embed-text ships, `gte-embedding` by
[CLS] as gte-*-v1.5 ship) against sentence-transformers' own `SentenceTransformer(path).encode`
at cosine >= 0.99999, on seeded random texts over the fixture words and one input a few tokens
short of the 128-position limit; classifiers against Transformers' probabilities at 1e-4.

sentence-transformers loads the tokenizer through Transformers' AutoTokenizer, which maps no
tokenizer to the model types nomic_bert and gte. Where a package's tokenizer_config.json names
no tokenizer class (the family reads tokenizer.json alone), the reference loads a copy that
names `PreTrainedTokenizerFast` and its special tokens there, as the Hub packages name theirs;
the tokenizer.json, weights and modules are the served package's own.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from families.task_heads.harness import ATOL, Harness, rows_of, softmax

from vllm_srun.plugins.surfaces import ClassifyRequest, EmbeddingsRequest, TextPair
from vllm_srun.testing.task_heads_fixtures import MAX_POSITIONS
from vllm_srun.testing.tokenizer_fixtures import WORDS

COSINE = 0.99999
EMBEDDERS = {"nomic-bert-embedding": "mean", "gte-embedding": "cls"}
CLASSIFIERS = ["nomic-bert-sequence", "gte-sequence"]


def random_texts(seed: int, count: int = 12) -> list[str]:
    """Texts this test did not write: words of the fixture vocabulary in seeded random order,
    lengths 1 to 40 words, some capitalised or followed by punctuation."""
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        words = [rng.choice(WORDS) for _ in range(rng.randint(1, 40))]
        words = [w.capitalize() if rng.random() < 0.2 else w for w in words]
        texts.append(" ".join(w + rng.choice(["", "", "", ",", "."]) for w in words))
    return texts


def long_text(seed: int, tokens: int) -> str:
    """Plain fixture words (one token each) filling `tokens` positions with [CLS] and [SEP]."""
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(tokens - 2))


def reference_copy(path: Path, root: Path) -> Path:
    """The package as sentence-transformers can load it (see the module docstring)."""
    if "tokenizer_class" in json.loads((path / "tokenizer_config.json").read_text()):
        return path
    out = root / f"st-{path.name}"
    if not out.exists():
        shutil.copytree(path, out)
        config = json.loads((out / "tokenizer_config.json").read_text())
        config.update(
            tokenizer_class="PreTrainedTokenizerFast",
            pad_token="[PAD]",
            unk_token="[UNK]",
            cls_token="[CLS]",
            sep_token="[SEP]",
            mask_token="[MASK]",
        )
        (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


def sentence_transformers_encode(path: Path, texts: list[str]) -> np.ndarray:
    st = pytest.importorskip("sentence_transformers")
    model = st.SentenceTransformer(str(path), device="cpu")
    out: np.ndarray = model.encode(texts, convert_to_numpy=True, batch_size=4)
    return out


def assert_cosines(got: list[Any], want: np.ndarray, *, check: bool = True) -> list[float]:
    """Cosine of each vector with its reference; with `check`, all at least COSINE."""
    assert len(got) == len(want)
    cosines = []
    for vector, ref in zip(got, want, strict=True):
        v, r = np.asarray(vector, dtype=np.float64), ref.astype(np.float64)
        cosines.append(float(v @ r / np.linalg.norm(v) / np.linalg.norm(r)))
    if check:
        assert min(cosines) >= COSINE, cosines
    return cosines


def without_token_types(path: Path, root: Path) -> Path:
    """A copy of a GTE package as gte-base-en-v1.5 ships: type_vocab_size 0, no type table."""
    from safetensors.torch import load_file, save_file

    out = root / f"no-types-{path.name}"
    if not out.exists():
        shutil.copytree(path, out)
        tensors = load_file(str(out / "model.safetensors"))
        kept = {k: v for k, v in tensors.items() if "token_type_embeddings" not in k}
        assert len(kept) == len(tensors) - 1
        save_file(kept, str(out / "model.safetensors"), metadata={"format": "pt"})
        config = json.loads((out / "config.json").read_text())
        config["type_vocab_size"] = 0
        (out / "config.json").write_text(json.dumps(config))
        shutil.rmtree(out / "onnx", ignore_errors=True)  # traced with the type table
    return out


@pytest.mark.torch
@pytest.mark.parametrize("variant", sorted(EMBEDDERS))
def test_embeddings_match_sentence_transformers(
    th: Harness, engine: str, variant: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    model = th.load(variant, engine)
    assert model.info.embedding is not None and model.info.embedding.pooling == EMBEDDERS[variant]
    texts = [*random_texts(seed=sum(map(ord, variant))), long_text(seed=7, tokens=MAX_POSITIONS - 3)]
    request = EmbeddingsRequest(input=texts)
    rows, types = rows_of(model, "embeddings", request)
    assert len(rows[-1]) == MAX_POSITIONS - 3 and all(t is None for t in types)
    got = th.roundtrip(model, "embeddings", request)
    root = tmp_path_factory.getbasetemp()
    want = sentence_transformers_encode(reference_copy(th.package(variant), root), texts)
    assert_cosines([d.embedding for d in got.data], want)


@pytest.mark.torch
def test_gte_without_token_types_matches_sentence_transformers(
    th: Harness, tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = tmp_path_factory.getbasetemp()
    path = without_token_types(th.package("gte-embedding"), root)
    model = th.load_path(path, "native")
    texts = random_texts(seed=5, count=6)
    got = th.roundtrip(model, "embeddings", EmbeddingsRequest(input=texts))
    want = sentence_transformers_encode(reference_copy(path, root), texts)
    assert_cosines([d.embedding for d in got.data], want)
    # The type table is what differs from the full package: its vectors are not these.
    full = th.roundtrip(th.load("gte-embedding", "native"), "embeddings", EmbeddingsRequest(input=texts))
    assert max(assert_cosines([d.embedding for d in full.data], want, check=False)) < COSINE


@pytest.mark.torch
@pytest.mark.parametrize("variant", CLASSIFIERS)
def test_sequence_probabilities_match_transformers(th: Harness, engine: str, variant: str) -> None:
    model = th.load(variant, engine)
    texts = random_texts(seed=sum(map(ord, variant)), count=6)
    pairs = [TextPair(text=a, text_pair=b) for a, b in zip(texts[:3], texts[3:], strict=True)]
    inputs: list[Any] = [*texts, *pairs, long_text(seed=3, tokens=MAX_POSITIONS - 2)]
    request = ClassifyRequest(input=inputs)
    out = th.roundtrip(model, "classify", request)
    rows, types = rows_of(model, "classify", request)
    # Both fixtures have two token types: a pair's second text is type 1, as Transformers reads it.
    assert all(t is not None and 1 in t for t in types[6:9])
    ref = th.reference(
        th.package(variant), rows, [t or [0] * len(r) for r, t in zip(rows, types, strict=True)]
    )
    assert len(out.results) == len(inputs)
    for result, logits in zip(out.results, ref, strict=True):
        probs = softmax(logits.astype(np.float64))
        np.testing.assert_allclose(result.probabilities, probs, atol=ATOL)
        assert result.label == out.labels[int(np.argmax(probs))]


@pytest.mark.torch
@pytest.mark.parametrize(
    ("target", "setting", "value"),
    [
        ("nomic_bert:NomicBert", "rope_parameters", {"rope_type": "linear", "factor": 2.0}),
        ("nomic_bert:NomicBert", "rope_parameters", {"rope_type": "default", "partial_rotary_factor": 0.5}),
        ("nomic_bert:NomicBert", "rotary_emb_interleaved", True),
        ("nomic_bert:NomicBert", "rotary_emb_fraction", 0.5),
        ("nomic_bert:NomicBert", "rotary_emb_base", 10000),
        ("nomic_bert:NomicBert", "prenorm", True),
        ("nomic_bert:NomicBert", "moe_every_n_layers", 2),
        ("gte:Gte", "rope_scaling", {"type": "ntk", "factor": 2.0}),
        ("gte:Gte", "logn_attention_scale", True),
        ("gte:Gte", "layer_norm_type", "rms_norm"),
    ],
)
def test_unsupported_settings_are_refused_by_name(target: str, setting: str, value: Any) -> None:
    import importlib

    from vllm_srun.errors import ConfigError

    module, _, name = target.partition(":")
    cls = getattr(importlib.import_module(f"vllm_srun.engines.native.{module}"), name)
    config = {"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2}
    config["intermediate_size"] = 32
    cls(config)  # the defaults build
    with pytest.raises(ConfigError, match=setting):
        cls({**config, setting: value})


@pytest.mark.torch
def test_hub_spelled_nomic_config_builds_the_same_network() -> None:
    """nomic-embed-text's config.json spells the sizes n_embd, n_layer, ...: the row reads them."""
    from vllm_srun.engines.native.nomic_bert import NomicBert
    from vllm_srun.plugins.architectures import standard_config

    hub = {
        "architectures": ["NomicBertModel"],
        "model_type": "nomic_bert",
        "vocab_size": 50,
        "n_embd": 16,
        "n_layer": 3,
        "n_head": 2,
        "n_inner": 24,
        "n_positions": 64,
        "rotary_emb_base": 1000,
        "rotary_emb_fraction": 1.0,
        "rotary_emb_interleaved": False,
        "rotary_scaling_factor": None,
        "prenorm": False,
        "causal": False,
        "qkv_proj_bias": False,
        "mlp_fc1_bias": False,
        "mlp_fc2_bias": False,
    }
    model = NomicBert(standard_config(hub))
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    assert model.num_layers == 3
    assert shapes["nomic_bert.encoder.layers.0.attn.Wqkv.weight"] == (48, 16)
    assert shapes["nomic_bert.encoder.layers.2.mlp.fc1.weight"] == (48, 16)
