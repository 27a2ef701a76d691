"""The check an approximate model (bfloat16, int8) must pass before it serves: does it still
give float32's answers?

It is compared with a float32 twin built from the same weights, on a fixed corpus, through its
own surface, and held to its output kind's bounds (BOUNDS): cosine and neighbour overlap for
embedders, Kendall's tau-b for rerankers, label agreement and probability change for
classifiers and taggers. A model that misses a bound, or has no check, is refused with every
figure; `describe()` gives the figures beside their bounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vllm_srun.errors import ConfigError
from vllm_srun.plugins.base import LoadedModel
from vllm_srun.registry.corpus import corpus
from vllm_srun.registry.golden import answer
from vllm_srun.registry.loader import Prepared

CHECK_TEXTS = 256
BATCH = 32
NEIGHBOURS = 10
# Rerank: this many queries, each over the same documents (as many pairs as CHECK_TEXTS).
QUERIES = 16
DOCUMENTS = 16


@dataclass(frozen=True)
class Bound:
    """`figure` must be at least (or, `at_most`, at most) `limit`."""

    figure: str
    limit: float
    at_most: bool = False

    def holds(self, value: float) -> bool:
        return value <= self.limit if self.at_most else value >= self.limit

    def words(self) -> str:
        return f"{'<=' if self.at_most else '>='} {self.limit}"


EMBEDDING_BF16 = (Bound("min_cosine", 0.9995), Bound("neighbour_overlap", 0.95))
EMBEDDING_INT8 = (Bound("min_cosine", 0.99), Bound("mean_cosine", 0.997), Bound("neighbour_overlap", 0.95))
BOUNDS: dict[str, tuple[Bound, ...]] = {
    "classify": (Bound("label_agreement", 0.995), Bound("max_probability_delta", 0.02, at_most=True)),
    "token": (Bound("token_agreement", 0.995), Bound("max_probability_delta", 0.02, at_most=True)),
    "rerank": (Bound("min_kendall_tau", 0.98),),
}


def bounds_for(check: str, dtype: str) -> tuple[Bound, ...]:
    """The bounds of a kind of output at `dtype`: embedders' depend on the dtype."""
    if check == "embeddings":
        return EMBEDDING_INT8 if dtype == "int8" else EMBEDDING_BF16
    return BOUNDS[check]


@dataclass(frozen=True)
class Approximation:
    """What the check measured (`figures`) and the bounds it was held to."""

    check: str
    texts: int
    dtype: str
    figures: dict[str, float]
    bounds: tuple[Bound, ...] = field(default=())

    def missed(self) -> list[Bound]:
        return [b for b in self.bounds if not b.holds(self.figures[b.figure])]

    def passed(self) -> bool:
        return not self.missed()

    def describe(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "texts": self.texts,
            "dtype": self.dtype,
            **{name: round(value, 6) for name, value in self.figures.items()},
            "required": {b.figure: b.words() for b in self.bounds},
        }


def float32_twin(prepared: Prepared) -> LoadedModel:
    """The same package loaded again with float32 numerics, on the same device."""
    assert prepared.engine is not None and prepared.device is not None
    family, package = prepared.family, prepared.resolved.package
    host = prepared.engine.read(prepared.spec, "float32")
    engine_model = prepared.engine.load(prepared.spec, prepared.device, "float32", host)
    return family.load(
        package,
        prepared.spec,
        engine_model,
        name=prepared.name,
        verification=family.verify(package),
        numerics="float32",
    )


def _batches(texts: list[str]) -> list[list[str]]:
    return [texts[i : i + BATCH] for i in range(0, len(texts), BATCH)]


def _unit(rows: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    out: np.ndarray = rows / np.where(norms > 0, norms, 1.0)
    return out


def neighbour_overlap(ours: np.ndarray, theirs: np.ndarray, k: int = NEIGHBOURS) -> float:
    """The mean, over texts, of the share of a text's k nearest others (by cosine) that are
    also among its k nearest in the twin's vectors."""
    found = []
    for vectors in (ours, theirs):
        unit = _unit(vectors.astype(np.float64))
        similarity = unit @ unit.T
        np.fill_diagonal(similarity, -np.inf)  # a text is not its own neighbour
        found.append(np.argsort(-similarity, axis=1, kind="stable")[:, :k])
    shared = [len(set(a) & set(b)) / k for a, b in zip(found[0], found[1], strict=True)]
    return float(np.mean(shared))


def kendall_tau(a: np.ndarray, b: np.ndarray) -> float:
    """Kendall's tau-b of two score lists (ties in either count as neither agreeing nor not).
    Two lists tied throughout agree (1.0); one tied throughout against one that ranks is no
    agreement (0.0): a quantization that flattens every score must not pass as keeping order."""
    upper = np.triu_indices(len(a), 1)
    sa = np.sign(np.subtract.outer(a, a))[upper]
    sb = np.sign(np.subtract.outer(b, b))[upper]
    untied = float(np.count_nonzero(sa)) * float(np.count_nonzero(sb))
    if not untied:
        return 1.0 if not np.count_nonzero(sa) and not np.count_nonzero(sb) else 0.0
    return float((sa * sb).sum() / np.sqrt(untied))


def _request(batch: list[str], **options: Any) -> dict[str, Any]:
    return {"input": batch, "options": {"overflow": "truncate", **options}}


def embeddings_figures(model: LoadedModel, reference: LoadedModel, texts: list[str]) -> dict[str, float]:
    ours: list[Any] = []
    theirs: list[Any] = []
    for batch in _batches(texts):
        for rows, who in ((ours, model), (theirs, reference)):
            rows.extend(item["embedding"] for item in answer(who, "embeddings", _request(batch))["data"])
    a, b = np.asarray(ours, dtype=np.float64), np.asarray(theirs, dtype=np.float64)
    cosines = (_unit(a) * _unit(b)).sum(axis=1)
    return {
        "min_cosine": float(cosines.min()),
        "mean_cosine": float(cosines.mean()),
        "neighbour_overlap": neighbour_overlap(a, b),
    }


def rerank_figures(model: LoadedModel, reference: LoadedModel) -> dict[str, float]:
    documents = corpus(DOCUMENTS, seed=9)
    taus = []
    for query in corpus(QUERIES, seed=8):
        request = {"query": query, "documents": documents, "options": {"overflow": "truncate"}}
        scores = []
        for who in (model, reference):
            results = answer(who, "rerank", request)["results"]
            by_index = {r["index"]: r["relevance_score"] for r in results}
            scores.append(np.asarray([by_index[i] for i in range(len(documents))], dtype=np.float64))
        taus.append(kendall_tau(scores[0], scores[1]))
    return {"min_kendall_tau": min(taus), "mean_kendall_tau": float(np.mean(taus))}


def _readings(result: dict[str, Any]) -> list[tuple[Any, list[float]]]:
    """(decision, probabilities) of a result, or of each token of a tagger's. A multi-label
    head decides the labels it selects (scores at or over the threshold), not its top one."""
    if result.get("tokens") is not None:
        return [(t["label"], t["probabilities"]) for t in result["tokens"]]
    if result.get("scores") is not None:
        return [(sorted(result.get("selected") or []), result["scores"])]
    return [(result.get("label"), result.get("probabilities") or [])]


def classify_figures(
    model: LoadedModel, reference: LoadedModel, texts: list[str], *, tokens: bool
) -> dict[str, float]:
    agree = total = 0
    delta = 0.0
    options = {"return_tokens": True} if tokens else {}
    for batch in _batches(texts):
        ours, theirs = (
            answer(who, "classify", _request(batch, **options))["results"] for who in (model, reference)
        )
        for a, b in zip(ours, theirs, strict=True):
            for (label_a, probs_a), (label_b, probs_b) in zip(_readings(a), _readings(b), strict=True):
                agree, total = agree + (label_a == label_b), total + 1
                if probs_a:
                    delta = max(delta, float(np.max(np.abs(np.subtract(probs_a, probs_b)))))
    name = "token_agreement" if tokens else "label_agreement"
    return {name: agree / max(total, 1), "max_probability_delta": delta}


def _token_head(model: LoadedModel) -> bool:
    return bool(model.info.heads) and model.info.heads[0].kind == "token"


def compare(
    model: LoadedModel, reference: LoadedModel, *, dtype: str, texts: int = CHECK_TEXTS
) -> Approximation:
    """The figures of `model` against its float32 `reference`, by its kind of output."""
    corpus_texts = corpus(texts, seed=7)
    surfaces = model.info.surfaces
    if "embeddings" in surfaces:
        check, figures = "embeddings", embeddings_figures(model, reference, corpus_texts)
    elif "rerank" in surfaces:
        check, figures, texts = "rerank", rerank_figures(model, reference), QUERIES * DOCUMENTS
    elif "classify" in surfaces:
        tokens = _token_head(model)
        check = "token" if tokens else "classify"
        figures = classify_figures(model, reference, corpus_texts, tokens=tokens)
    else:
        raise ConfigError(
            f"approximate numerics have no check for a model serving {', '.join(surfaces)}: refused"
        )
    return Approximation(check, texts, dtype, figures, bounds_for(check, dtype))


def check_approximation(prepared: Prepared, model: LoadedModel) -> Approximation:
    """Compare with a float32 twin; ConfigError (the model is refused) when it falls short."""
    result = compare(model, float32_twin(prepared), dtype=prepared.placement.dtype)
    missed = result.missed()
    if missed:
        short = ", ".join(f"{b.figure} {result.figures[b.figure]:.6f} (needs {b.words()})" for b in missed)
        raise ConfigError(
            f"approximate numerics ({prepared.placement.dtype}) refused: they differ from float32 beyond "
            f"their bounds: {short} "
            f"({result.describe()})"
        )
    return result
