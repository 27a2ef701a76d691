"""The real all-MiniLM-L6-v2 package: its files, its tokenizer used without the 128-token
truncation its tokenizer.json asks for, its 256-token limit from sentence_bert_config.json, and
embeddings equal to the sentence-transformers recipe (sentence-transformers itself is the
reference in tests/compat/test_sentence_transformers.py)."""

from __future__ import annotations

import numpy as np
import pytest
from families.task_heads.harness import ENGINES, Harness
from helpers import minilm_dir

from vllm_srun.plugins.package import ModelPackage
from vllm_srun.plugins.surfaces import EmbeddingsRequest, Options


def _varied_texts(count: int = 100) -> list[str]:
    base = [
        "A man is eating food.",
        "The new movie is awesome",
        "Das ist ein Beispielsatz auf Deutsch, mit Umlauten: äöü ß.",
        "¿Dónde está la biblioteca? Está cerca del café.",
        "東京は日本の首都です。中文文本也在这里。",
        "Emoji time 😀🎉👩‍👩‍👧 and flags 🇫🇷 mixed with text",
        "Ελληνικά και русский текст вместе",
        "",
        "a",
        "    leading and trailing spaces    ",
    ]
    long = " ".join(f"sentence number {i} talks about retrieval, embeddings and search." for i in range(28))
    texts = []
    for i in range(count):
        text = base[i % len(base)]
        if i % 7 == 3:
            text = f"{text} {long[: 40 * (i % 13 + 1)]}"
        if i % 11 == 5:
            text = long  # about 390 tokens: past the 128 the package's tokenizer.json truncates to
        texts.append(f"{text} #{i}" if i >= len(base) else text)
    return texts


def test_minilm_detect_verify_and_tokenizer_untruncated(th: Harness) -> None:
    from transformers import AutoTokenizer  # tokenizers only: no torch needed

    path = minilm_dir()
    package = ModelPackage(path)
    assert th.family.detect(package)
    verification = th.family.verify(package)
    assert set(verification.files) == {
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "model.safetensors",
        "modules.json",
        "1_Pooling/config.json",
        "sentence_bert_config.json",
        "config_sentence_transformers.json",
    }
    # sentence_bert_config.json's max_seq_length, not the checkpoint's 512 positions.
    assert verification.max_tokens == 256
    model = th.load_path(path, None, name="all-MiniLM-L6-v2")
    assert model.info.embedding is not None
    assert model.info.embedding.dimension == 384 and model.info.embedding.normalized
    reference = AutoTokenizer.from_pretrained(str(path))
    between = " ".join(["retrieval and search"] * 60)  # between 128 and 256 tokens
    texts = [t for t in [*_varied_texts(30), between] if len(reference(t)["input_ids"]) <= 256]
    plan = model.plan_surface("embeddings", EmbeddingsRequest(input=texts))
    for text, item in zip(texts, plan.items, strict=True):
        assert item.token_ids == reference(text)["input_ids"], text
        assert item.output == "mean" and item.type_ids is None
    assert max(len(i.token_ids) for i in plan.items) > 128  # neither padded nor truncated to 128


@pytest.mark.torch
def test_minilm_embeddings_match_sentence_transformers_recipe(th: Harness) -> None:
    if "native" not in ENGINES:
        pytest.skip("the native engine is not importable yet; all-MiniLM has no ONNX graph to run instead")
    import torch
    from transformers import AutoModel, AutoTokenizer

    path = minilm_dir()
    model = th.load_path(path, "native", name="all-MiniLM-L6-v2")
    texts = _varied_texts(100)
    # Texts past the 256-token limit are truncated there, as sentence-transformers does.
    request = EmbeddingsRequest(input=texts, options=Options(overflow="truncate"))
    out = th.roundtrip(model, "embeddings", request)
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    hf = AutoModel.from_pretrained(str(path), attn_implementation="eager", dtype=torch.float32).eval()
    expected = []
    for text in texts:  # one at a time: no padding, so mean pooling needs no mask
        with torch.no_grad():
            encoded = tokenizer(text, truncation=True, max_length=256, return_tensors="pt")
            hidden = hf(**encoded).last_hidden_state[0]
        expected.append(torch.nn.functional.normalize(hidden.mean(0), dim=-1).numpy())
    cosines = [
        float(np.dot(d.embedding, e)) / float(np.linalg.norm(d.embedding))
        for d, e in zip(out.data, expected, strict=True)
    ]
    assert min(cosines) >= 0.99999, min(cosines)
