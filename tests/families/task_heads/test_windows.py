"""windows.py: long inputs rejected, truncated or windowed, the result saying which, and window
results combined per head as Transformers would answer each window."""

from __future__ import annotations

import re

import numpy as np
import pytest
from families.task_heads.harness import ATOL, LONG, Harness, rows_of, sigmoid, softmax, unit

from vllm_srun.errors import InvalidRequest
from vllm_srun.families.task_heads.windows import MAX_WINDOWS
from vllm_srun.plugins.bodies import UnsupportedOption
from vllm_srun.plugins.surfaces import (
    ClassifyRequest,
    EmbeddingsRequest,
    Options,
    RerankRequest,
    TextPair,
    WindowOptions,
)


def test_truncate_pairs_longest_first(th: Harness) -> None:
    model = th.load("bert-reranker", None)
    plan = model.plan_surface(
        "rerank",
        RerankRequest(query="what is the capital", documents=[LONG], options=Options(overflow="truncate")),
    )
    (item,) = plan.items
    assert len(item.token_ids) == 128
    # The short query survives whole; the document is cut.
    assert item.type_ids is not None
    assert item.type_ids.count(0) == 1 + 4 + 1 and item.type_ids.count(1) == 128 - 6
    # Both texts long: each keeps half of the 125 text tokens.
    both = TextPair(text=LONG, text_pair=LONG)
    plan = model.plan_surface("classify", ClassifyRequest(input=both, options=Options(overflow="truncate")))
    (item,) = plan.items
    assert item.type_ids is not None
    assert len(item.token_ids) == 128 and item.type_ids.count(0) == 1 + 62 + 1


def test_bad_window_options_are_refused(th: Harness) -> None:
    model = th.load("bert-sequence", None)
    # What the model cannot window (past its limit, no room left after its special tokens) is its
    # refusal (422); a window without overflow "window" is a malformed request (400).
    cases: dict[str, tuple[Options, type[Exception]]] = {
        "options.window.tokens: 129 exceeds the model's limit": (
            Options(overflow="window", window=WindowOptions(tokens=129)),
            UnsupportedOption,
        ),
        "options.window.overlap": (
            Options(overflow="window", window=WindowOptions(tokens=10, overlap=8)),
            UnsupportedOption,
        ),
        "options.window:": (Options(window=WindowOptions(tokens=10)), InvalidRequest),
        # 2 tokens are [CLS] and [SEP]: no text fits, and the message blames tokens, not overlap.
        "options.window.tokens: windows of 2 tokens leave 0": (
            Options(overflow="window", window=WindowOptions(tokens=2)),
            UnsupportedOption,
        ),
    }
    for field, (options, refusal) in cases.items():
        with pytest.raises(refusal, match=re.escape(field)) as raised:
            model.plan_surface("classify", ClassifyRequest(input="x", options=options))
        assert type(raised.value) is refusal, field


def test_too_many_windows_fail_that_input_alone(th: Harness) -> None:
    model = th.load("bert-sequence", None)
    # Windows of 8 text tokens stepping by 1: a text of MAX_WINDOWS + 8 tokens needs one too many.
    options = Options(overflow="window", window=WindowOptions(tokens=10, overlap=7))
    words = " ".join(["paris"] * (MAX_WINDOWS + 8))
    plan = model.plan_surface("classify", ClassifyRequest(input=[words, "paris"], options=options))
    assert len(plan.items) == 1  # only the short input runs
    finished = model.finish_surface(plan, [np.zeros(2, dtype=np.float32)])
    failed = finished.results[0]
    assert failed.error == "scan_budget_exceeded" and str(MAX_WINDOWS + 1) in (failed.message or "")
    # One window fewer is within the bound.
    fits = " ".join(["paris"] * (MAX_WINDOWS + 7))
    plan = model.plan_surface("classify", ClassifyRequest(input=fits, options=options))
    assert len(plan.items) == MAX_WINDOWS and all(len(item.token_ids) == 10 for item in plan.items)


@pytest.mark.torch
def test_reject_answers_siblings(th: Harness, engine: str) -> None:
    model = th.load("bert-sequence", engine)
    out = th.roundtrip(model, "classify", ClassifyRequest(input=["good movie", LONG, "bad"]))
    ok, long, bad = out.results
    assert long.error == "max_length_exceeded" and "128" in (long.message or "")
    assert long.input.tokens > 128 and long.input.processed_tokens == 0 and long.probabilities is None
    assert ok.error is None and bad.error is None and ok.probabilities is not None


@pytest.mark.torch
def test_truncate_reports_and_matches_reference(th: Harness, engine: str) -> None:
    model = th.load("bert-sequence", engine)
    request = ClassifyRequest(input=[LONG], options=Options(overflow="truncate"))
    out = th.roundtrip(model, "classify", request)
    (rows, _) = rows_of(model, "classify", request)
    tokenizer = model.encoder.tokenizer
    assert len(rows[0]) == 128
    assert rows[0][0] == tokenizer.token_to_id("[CLS]") and rows[0][-1] == tokenizer.token_to_id("[SEP]")
    info = out.results[0].input
    assert info.truncated and info.processed_tokens == 128 and info.tokens > 128 and info.windows == 1
    ref = th.reference(th.package("bert-sequence"), rows)[0]
    np.testing.assert_allclose(out.results[0].probabilities, softmax(ref.astype(np.float64)), atol=ATOL)


@pytest.mark.torch
def test_window_sequence_takes_max_logits(th: Harness, engine: str) -> None:
    model = th.load("bert-multilabel", engine)
    request = ClassifyRequest(
        input=[LONG, "short"], options=Options(overflow="window", window=WindowOptions(tokens=64, overlap=16))
    )
    out = th.roundtrip(model, "classify", request)
    rows, _ = rows_of(model, "classify", request)
    info = out.results[0].input
    content = info.tokens - 2
    assert info.windows == 1 + -(-(content - 62) // 46)  # windows of 62 text tokens, step 46
    assert info.processed_tokens == sum(len(r) for r in rows[:-1]) and not info.truncated
    assert all(len(r) <= 64 for r in rows)
    ref = th.reference(th.package("bert-multilabel"), rows[:-1])
    expected = sigmoid(np.max(np.stack(ref), axis=0).astype(np.float64))
    np.testing.assert_allclose(out.results[0].scores, expected, atol=ATOL)
    # Each window is listed: its content-token range and its own scores.
    windows = out.results[0].windows
    assert windows is not None and len(windows) == info.windows
    for k, (window, logits) in enumerate(zip(windows, ref, strict=True)):
        assert (window.start, window.end) == (46 * k, min(46 * k + 62, content))
        np.testing.assert_allclose(window.scores, sigmoid(logits.astype(np.float64)), atol=ATOL)
        assert window.probabilities is None
    assert out.results[1].input.windows == 1
    short = out.results[1].windows
    assert short is not None and [(w.start, w.end) for w in short] == [(0, out.results[1].input.tokens - 2)]


@pytest.mark.torch
def test_window_pairs_keep_the_query(th: Harness, engine: str) -> None:
    model = th.load("bert-reranker", engine)
    request = RerankRequest(
        query="what is the capital",
        documents=[LONG, "paris"],
        options=Options(overflow="window", window=WindowOptions(tokens=40, overlap=8)),
    )
    out = th.roundtrip(model, "rerank", request)
    rows, types = rows_of(model, "rerank", request)
    assert all(t.count(0) == 6 for t in types)  # [CLS] + 4 query tokens + [SEP] in every window
    ref = th.reference(th.package("bert-reranker"), rows, types)
    by_index = {r.index: r for r in out.results}
    n = by_index[0].input.windows
    assert n > 1
    assert abs(by_index[0].logit - max(float(r[0]) for r in ref[:n])) < ATOL


@pytest.mark.torch
def test_window_embeddings_average_windows(th: Harness, engine: str) -> None:
    model = th.load("bert-embedding", engine)
    request = EmbeddingsRequest(
        input=LONG, options=Options(overflow="window", window=WindowOptions(tokens=100))
    )
    out = th.roundtrip(model, "embeddings", request)
    rows, _ = rows_of(model, "embeddings", request)
    windows = [unit(h.astype(np.float64).mean(0)) for h in th.reference(th.package("bert-embedding"), rows)]
    assert out.data[0].input.windows == len(rows) > 1
    np.testing.assert_allclose(out.data[0].embedding, unit(np.mean(windows, axis=0)), atol=ATOL)


def test_truncate_left_keeps_the_last_tokens(th: Harness) -> None:
    """truncation_direction "left" (TEI's Left) keeps a text's end and every special token, as the
    tokenizers library truncating on the left does; a pair loses from the longer text's start."""
    from tokenizers import Tokenizer

    model = th.load("bert-reranker", None)
    reference = Tokenizer.from_str(model.encoder.tokenizer.to_str())
    reference.no_padding()
    reference.enable_truncation(128, direction="left")
    left = Options(overflow="truncate", truncation_direction="left")
    for request in (
        ClassifyRequest(input=LONG, options=left),
        ClassifyRequest(input=TextPair(text="what is the capital", text_pair=LONG), options=left),
        ClassifyRequest(input=TextPair(text=LONG, text_pair=LONG), options=left),
    ):
        (item,) = model.plan_surface("classify", request).items
        text = request.input.text if isinstance(request.input, TextPair) else request.input
        pair = request.input.text_pair if isinstance(request.input, TextPair) else None
        assert isinstance(text, str)
        assert item.token_ids == reference.encode(text, pair).ids
    right = ClassifyRequest(input=LONG, options=Options(overflow="truncate"))
    (cut_right,) = model.plan_surface("classify", right).items
    (cut_left,) = model.plan_surface("classify", ClassifyRequest(input=LONG, options=left)).items
    assert cut_right.token_ids != cut_left.token_ids
