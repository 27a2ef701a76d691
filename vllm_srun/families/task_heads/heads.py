"""Heads: what a model offers on each surface, and how raw engine outputs become answers.

Engines return raw rows (logits, token logits, unnormalised pooled vectors); they are cached
that way and every request option (threshold, dimensions, top_n...) is applied in finish.
Windows combine per head: sequence/scores take each label's maximum logit, relevance the best
window, pooled the mean of the window vectors (an approximation of the whole text's), token
the union of the windows' spans (spans.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vllm_srun.plugins.base import HeadInfo

SEQUENCE, SCORES, TOKEN, POOLED, RELEVANCE = "sequence", "scores", "token", "pooled", "relevance"
SPARSE = "sparse"  # a SPLADE model: sparse embeddings (and every token's state), no pooled vector

# Which surfaces each head kind answers.
SURFACES_OF: dict[str, tuple[str, ...]] = {
    SEQUENCE: ("classify",),
    SCORES: ("classify",),
    TOKEN: ("classify",),
    RELEVANCE: ("rerank", "classify"),
    POOLED: ("embeddings", "rerank"),
    SPARSE: ("embeddings",),
}
DEFAULT_THRESHOLD = 0.5


def _classify_head(name: str, kind: str, labels: list[str], threshold: float | None = None) -> HeadInfo:
    """A classify head with the facts upstream's HeadCard states: the inputs it takes (a token
    head tags single texts), its long-input policy when a request names none (reject: nothing
    is cut silently) and how it combines windows (see the module docstring)."""
    return HeadInfo(
        name=name,
        kind=kind,
        labels=labels,
        threshold=threshold,
        inputs=["text"] if kind == TOKEN else ["text", "pair"],
        default_threshold=threshold,
        overflow="reject",
        reduction="span_union" if kind == TOKEN else "max",
    )


def heads_for(kind: str, labels: list[str], problem_type: str | None) -> list[HeadInfo]:
    """The heads of a model, the default head of each surface first.

    A sequence classifier with one label is a cross-encoder (relevance only); with two labels
    it also reranks by the probability of its last label; a multi-label one has `scores`.
    """
    if kind == "token":
        return [_classify_head(TOKEN, TOKEN, labels)]
    if kind == "embedding":
        return [HeadInfo(name=POOLED, kind=POOLED)]
    if kind == SPARSE:
        return [HeadInfo(name=SPARSE, kind=SPARSE)]
    if problem_type == "multi_label_classification":
        return [_classify_head(SCORES, SCORES, labels, DEFAULT_THRESHOLD)]
    if len(labels) == 1:
        return [_classify_head(RELEVANCE, RELEVANCE, labels)]
    heads = [_classify_head(SEQUENCE, SEQUENCE, labels)]
    if len(labels) == 2:
        heads.append(_classify_head(RELEVANCE, RELEVANCE, labels))
    return heads


def surfaces_of(heads: Sequence[HeadInfo]) -> list[str]:
    order = ("classify", "embeddings", "rerank")
    served = {s for head in heads for s in SURFACES_OF[head.kind]}
    return [s for s in order if s in served]


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    z = x - x.max(axis=axis, keepdims=True)
    e = np.exp(z)
    out: np.ndarray = e / e.sum(axis=axis, keepdims=True)
    return out


def sigmoid(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = 0.5 * (1.0 + np.tanh(0.5 * x))  # overflow-free form
    return out


def max_logits(windows: Sequence[np.ndarray]) -> np.ndarray:
    out: np.ndarray = np.max(np.stack([w.astype(np.float64) for w in windows]), axis=0)
    return out


@dataclass(frozen=True)
class Relevance:
    score: float
    logit: float


def relevance(windows: Sequence[np.ndarray]) -> Relevance:
    """sigmoid(logit) for a one-label model; for two labels, the last label's softmax
    probability, whose logit is the difference of the two. The best window wins."""
    best: Relevance | None = None
    for window in windows:
        logits = window.astype(np.float64).reshape(-1)
        logit = float(logits[0]) if logits.shape[0] == 1 else float(logits[-1] - logits[-2])
        current = Relevance(score=float(sigmoid(np.array(logit))), logit=logit)
        if best is None or current.score > best.score:
            best = current
    assert best is not None
    return best


def _normalised(v: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(v))
    out: np.ndarray = v / norm if norm > 0 else v
    return out


def pooled(windows: Sequence[np.ndarray], *, normalize: bool, dimensions: int | None) -> np.ndarray:
    """The embedding of one input: windows combined, normalised if the model normalises, then
    truncated to `dimensions` (Matryoshka) and normalised again when the model normalises."""
    vectors = [w.astype(np.float64).reshape(-1) for w in windows]
    if normalize:
        vectors = [_normalised(v) for v in vectors]
    vector = np.mean(np.stack(vectors), axis=0)
    if normalize:
        vector = _normalised(vector)
    if dimensions is not None and dimensions < vector.shape[0]:
        vector = vector[:dimensions]
        if normalize:
            vector = _normalised(vector)
    out: np.ndarray = vector.astype(np.float32)
    return out


def pool_tokens(hidden: np.ndarray, keep: np.ndarray, mode: str) -> np.ndarray:
    """sentence-transformers' Pooling over the kept positions of one row of token states: mean
    (0 when none is kept, as its clamped denominator gives), the first kept token, or the last."""
    states = hidden.astype(np.float64)
    if mode == "cls":
        out: np.ndarray = states[int(np.argmax(keep))] if keep.any() else states[0]
        return out
    if mode == "last":
        out = states[int(np.flatnonzero(keep)[-1])] if keep.any() else np.zeros(states.shape[1])
        return out
    count = int(keep.sum())
    out = states[keep].sum(axis=0) / max(count, 1) if count else np.zeros(states.shape[1])
    return out
