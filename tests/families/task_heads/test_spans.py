"""spans.py: token logits to labelled spans with code-point offsets, per-token readings, and
spans united across windows. Most tests tag with `TaggingEngine`, so the spans are known exactly."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from families.task_heads.harness import (
    ATOL,
    LONG,
    MULTIBYTE,
    TEXTS,
    Harness,
    TaggingEngine,
    rows_of,
    softmax,
    tagging_model,
)

from vllm_srun.plugins.surfaces import ClassifyRequest, Options, WindowOptions


def test_spans_have_code_point_offsets_on_multibyte_text(th: Harness) -> None:
    model = tagging_model(th, "bert-token")
    text = "Café 😀 中文: John Smith flew to New York City, then Paris."
    out = th.roundtrip(model, "classify", ClassifyRequest(input=text))
    spans = [(s.label, s.text, s.start, s.end) for s in out.results[0].spans]
    assert spans == [
        ("PER", "John Smith", text.index("John"), text.index("John") + 10),
        ("LOC", "New York City", text.index("New"), text.index("New") + 13),
        ("LOC", "Paris", text.index("Paris"), text.index("Paris") + 5),
    ]
    assert all(
        s.probability == pytest.approx(float(softmax(np.array([5.0, 0, 0, 0, 0]))[0]))
        for s in out.results[0].spans
    )


def test_span_threshold_and_plain_tags(th: Harness, tmp_path: Path) -> None:
    model = tagging_model(th, "bert-token")
    text = "John Smith lives in Paris"
    high = th.roundtrip(model, "classify", ClassifyRequest(input=text, options=Options(threshold=0.99)))
    assert high.results[0].spans == []
    # Plain tags (no B-/I-): consecutive words with one tag form one span.
    dst = tmp_path / "plain"
    shutil.copytree(th.plan_package("bert-token"), dst)
    config = json.loads((dst / "config.json").read_text())
    config["id2label"] = {"0": "O", "1": "PER", "2": "PER", "3": "LOC", "4": "LOC"}
    (dst / "config.json").write_text(json.dumps(config))
    plain = th.load_path(dst, None)
    plain.engine_model = TaggingEngine(plain.encoder.tokenizer.get_vocab(), model.labels)
    out = th.roundtrip(plain, "classify", ClassifyRequest(input=text))
    assert [(s.label, s.text) for s in out.results[0].spans] == [("PER", "John Smith"), ("LOC", "Paris")]


def test_window_token_spans_map_to_the_original_text(th: Harness) -> None:
    model = tagging_model(th, "modernbert-token")
    text = "Café 😀 " + " ".join(LONG.split()[:90])  # fits in one forward of 128 tokens
    whole = th.roundtrip(model, "classify", ClassifyRequest(input=text))
    windowed = th.roundtrip(
        model,
        "classify",
        ClassifyRequest(
            input=text,
            options=Options(
                overflow="window", window=WindowOptions(tokens=24, overlap=6), return_tokens=True
            ),
        ),
    )
    result = windowed.results[0]
    assert result.input.windows > 5
    assert [(s.label, s.start, s.end) for s in result.spans] == [
        (s.label, s.start, s.end) for s in whole.results[0].spans
    ]
    assert all(text[s.start : s.end] == s.text for s in result.spans)
    assert len(result.tokens) == result.input.tokens - 2  # each token reported once


@pytest.mark.torch
@pytest.mark.parametrize("variant", ["bert-token", "modernbert-token"])
def test_token_probabilities_match_transformers(th: Harness, engine: str, variant: str) -> None:
    model = th.load(variant, engine)
    request = ClassifyRequest(input=[*TEXTS, MULTIBYTE], options=Options(return_tokens=True))
    out = th.roundtrip(model, "classify", request)
    rows, _ = rows_of(model, "classify", request)
    ref = th.reference(th.package(variant), rows)
    for result, logits in zip(out.results, ref, strict=True):
        probs = softmax(logits.astype(np.float64))[1:-1]  # the tokens of the text, no [CLS]/[SEP]
        assert len(result.tokens) == len(probs)
        for token, p in zip(result.tokens, probs, strict=True):
            assert token.label == out.labels[int(p.argmax())]
            np.testing.assert_allclose(token.probabilities, p, atol=ATOL)


@pytest.mark.torch
@pytest.mark.parametrize("variant", ["bert-token", "modernbert-token"])
def test_random_spans_align_with_words(th: Harness, engine: str, variant: str) -> None:
    model = th.load(variant, engine)
    out = th.roundtrip(model, "classify", ClassifyRequest(input=[MULTIBYTE, TEXTS[3]]))
    tokenizer = model.encoder.tokenizer
    checked = 0
    for text, result in zip([MULTIBYTE, TEXTS[3]], out.results, strict=True):
        enc = tokenizer.encode(text)
        words = {w for w in enc.word_ids if w is not None}
        bounds = [enc.word_to_chars(w) for w in words]
        starts = {a + (len(text[a:b]) - len(text[a:b].lstrip())) for a, b in bounds}
        ends = {b - (len(text[a:b]) - len(text[a:b].rstrip())) for a, b in bounds}
        for span in result.spans:
            assert text[span.start : span.end] == span.text and span.text.strip() == span.text
            assert span.start in starts and span.end in ends, (span, text)
            assert 0 <= span.probability <= 1
            checked += 1
    assert checked > 0
