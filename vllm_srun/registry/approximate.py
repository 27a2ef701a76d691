"""The check an approximate model (bfloat16, int8) must pass before it serves: does it still
give float32's answers?

It is compared with a float32 twin built from the same weights, on a fixed corpus, through its
own surface, and held to its output kind's bounds (registry/bounds.py; the operator may set
them per model). A model that misses a bound, or has no check, is refused with every figure;
`describe()` gives the figures beside their bounds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vllm_srun.errors import ConfigError
from vllm_srun.plugins.base import LoadedModel
from vllm_srun.registry.bounds import Bound, acceptance, bounds_for
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

    def loosened(self) -> list[Bound]:
        """The bounds the operator set looser than the built-in ones."""
        return [b for b in self.bounds if b.loosened()]

    def describe(self) -> dict[str, Any]:
        """The figures, the bounds in force (`required`), and each figure beside its bound
        (`figures`: value, bound, and where the operator set it, the built-in one)."""
        by_figure = {b.figure: b for b in self.bounds}
        beside: dict[str, dict[str, Any]] = {}
        for name, value in self.figures.items():
            entry: dict[str, Any] = {"value": round(value, 6)}
            bound = by_figure.get(name)
            if bound is not None:
                entry["bound"] = bound.words()
                if bound.by_operator:
                    entry["set_by"] = "operator"
                if bound.default is not None:
                    entry["default"] = Bound(name, bound.default, bound.at_most).words()
            beside[name] = entry
        out = {
            "check": self.check,
            "texts": self.texts,
            "dtype": self.dtype,
            **{name: round(value, 6) for name, value in self.figures.items()},
            "required": {b.figure: b.words() for b in self.bounds},
            "figures": beside,
        }
        loosened = self.loosened()
        if loosened:
            out["loosened"] = {b.figure: b.words() for b in loosened}
        return out


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


def _spans(result: dict[str, Any]) -> set[tuple[str, int, int]]:
    return {(s["label"], s["start"], s["end"]) for s in result.get("spans") or ()}


def classify_figures(
    model: LoadedModel, reference: LoadedModel, texts: list[str], *, tokens: bool
) -> dict[str, float]:
    """Label agreement and the worst probability change; for a tagger, per token, with the
    99th percentile of the change and the share of entity spans (label, start, end) both give
    among those either gives."""
    agree = total = 0
    deltas: list[float] = []
    shared_spans = all_spans = 0
    options = {"return_tokens": True} if tokens else {}
    for batch in _batches(texts):
        ours, theirs = (
            answer(who, "classify", _request(batch, **options))["results"] for who in (model, reference)
        )
        for a, b in zip(ours, theirs, strict=True):
            for (label_a, probs_a), (label_b, probs_b) in zip(_readings(a), _readings(b), strict=True):
                agree, total = agree + (label_a == label_b), total + 1
                if probs_a:
                    deltas.append(float(np.max(np.abs(np.subtract(probs_a, probs_b)))))
            if tokens:
                spans_a, spans_b = _spans(a), _spans(b)
                shared_spans += len(spans_a & spans_b)
                all_spans += len(spans_a | spans_b)
    worst = max(deltas, default=0.0)
    if not tokens:
        return {"label_agreement": agree / max(total, 1), "max_probability_delta": worst}
    return {
        "token_agreement": agree / max(total, 1),
        "p99_probability_delta": float(np.percentile(deltas, 99)) if deltas else 0.0,
        "max_probability_delta": worst,
        # No span in either answer is no disagreement.
        "span_agreement": shared_spans / all_spans if all_spans else 1.0,
    }


def _token_head(model: LoadedModel) -> bool:
    return bool(model.info.heads) and model.info.heads[0].kind == "token"


def check_kind(model: LoadedModel) -> str:
    """The check a model's output gets: embeddings, rerank, classify or token."""
    surfaces = model.info.surfaces
    for check in ("embeddings", "rerank", "classify"):
        if check in surfaces:
            return "token" if check == "classify" and _token_head(model) else check
    raise ConfigError(
        f"approximate numerics have no check for a model serving {', '.join(surfaces)}: refused"
    )


def compare(
    model: LoadedModel,
    reference: LoadedModel,
    *,
    dtype: str,
    texts: int = CHECK_TEXTS,
    overrides: Mapping[str, float] | None = None,
) -> Approximation:
    """The figures of `model` against its float32 `reference`, by its kind of output, held to
    its bounds with the operator's `overrides` (refused before measuring where one does not
    apply to this kind of output)."""
    check = check_kind(model)
    bounds = bounds_for(check, dtype, overrides)
    corpus_texts = corpus(texts, seed=7)
    if check == "embeddings":
        figures = embeddings_figures(model, reference, corpus_texts)
    elif check == "rerank":
        figures, texts = rerank_figures(model, reference), QUERIES * DOCUMENTS
    else:
        figures = classify_figures(model, reference, corpus_texts, tokens=check == "token")
    return Approximation(check, texts, dtype, figures, bounds)


class Refused(ConfigError):
    """A twin check's refusal: `short` names each missed figure and its bound."""

    def __init__(self, result: Approximation) -> None:
        self.result = result
        self.short = "; ".join(
            f"{b.figure} {result.figures[b.figure]:.6f} (needs {b.words()})" for b in result.missed()
        )
        super().__init__(refusal(result))


def refusal(result: Approximation) -> str:
    """Why `result` is refused: each missed figure, its bound, and the option that would
    accept it."""
    parts = []
    for b in result.missed():
        value = result.figures[b.figure]
        whose = ", set by the operator" if b.by_operator else ""
        parts.append(
            f"{b.figure} {value:.6f} (needs {b.words()}{whose}; {acceptance(b, value)} would accept it)"
        )
    return (
        f"approximate numerics ({result.dtype}) refused: they differ from float32 beyond their bounds: "
        f"{'; '.join(parts)} ({result.describe()})"
    )


def check_approximation(prepared: Prepared, model: LoadedModel) -> Approximation:
    """Compare with a float32 twin; Refused (a ConfigError: the model is refused) when it
    falls short."""
    overrides = dict(prepared.options.bounds)
    check_kind(model)  # no twin is loaded for a model no check can hold
    result = compare(model, float32_twin(prepared), dtype=prepared.placement.dtype, overrides=overrides)
    if not result.passed():
        raise Refused(result)
    return result
