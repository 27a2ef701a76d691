"""The check a `max_speed` model must pass before it serves: does it still give float32's answers?

A model with approximate numerics (int8 linears, bfloat16) is compared with a float32 twin
built from the same weights, on a fixed corpus, through its own surface: embeddings by cosine
(every text ≥ MIN_COSINE), classifiers by label agreement (≥ MIN_AGREEMENT of the texts).
A model that falls short is refused; one whose surfaces have no such check is refused too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from vllm_srun.errors import ConfigError
from vllm_srun.plugins.base import LoadedModel
from vllm_srun.registry.golden import answer
from vllm_srun.registry.loader import Prepared
from vllm_srun.testing.corpus import corpus

CHECK_TEXTS = 256
BATCH = 32
MIN_COSINE = 0.999
MIN_AGREEMENT = 0.99


@dataclass(frozen=True)
class Approximation:
    """What the check measured; `describe()` is what /v1/models shows."""

    surface: str
    texts: int
    min_cosine: float | None = None
    label_agreement: float | None = None

    def passed(self) -> bool:
        if self.min_cosine is not None:
            return self.min_cosine >= MIN_COSINE
        return self.label_agreement is not None and self.label_agreement >= MIN_AGREEMENT

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"surface": self.surface, "texts": self.texts}
        if self.min_cosine is not None:
            out.update(min_cosine=round(self.min_cosine, 6), required=MIN_COSINE)
        if self.label_agreement is not None:
            out.update(label_agreement=round(self.label_agreement, 4), required=MIN_AGREEMENT)
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


def _labels(body: dict[str, Any]) -> list[Any]:
    """Each result's label, or its spans' (label, start, end) for taggers."""
    out = []
    for result in body["results"]:
        if "spans" in result:
            out.append([(s["label"], s["start"], s["end"]) for s in result["spans"]])
        else:
            out.append(result.get("label"))
    return out


def compare(model: LoadedModel, reference: LoadedModel, *, texts: int = CHECK_TEXTS) -> Approximation:
    corpus_texts = corpus(texts, seed=7)
    surfaces = model.info.surfaces
    if "embeddings" in surfaces:
        cosines: list[float] = []
        for batch in _batches(corpus_texts):
            request = {"input": batch, "options": {"overflow": "truncate"}}
            a = answer(model, "embeddings", request)["data"]
            b = answer(reference, "embeddings", request)["data"]
            for x, y in zip(a, b, strict=True):
                u, v = np.asarray(x["embedding"]), np.asarray(y["embedding"])
                cosines.append(float(u @ v / (np.linalg.norm(u) * np.linalg.norm(v) + 1e-12)))
        return Approximation("embeddings", len(corpus_texts), min_cosine=min(cosines))
    if "classify" in surfaces:
        agree = 0
        for batch in _batches(corpus_texts):
            request = {"input": batch, "options": {"overflow": "truncate"}}
            ours, theirs = (
                _labels(answer(model, "classify", request)),
                _labels(answer(reference, "classify", request)),
            )
            agree += sum(a == b for a, b in zip(ours, theirs, strict=True))
        return Approximation("classify", len(corpus_texts), label_agreement=agree / len(corpus_texts))
    raise ConfigError(f"max_speed has no check for a model serving {', '.join(surfaces)}: refused")


def check_approximation(prepared: Prepared, model: LoadedModel) -> Approximation:
    """Compare with a float32 twin; ConfigError (the model is refused) when it falls short."""
    result = compare(model, float32_twin(prepared))
    if not result.passed():
        raise ConfigError(
            f"max_speed refused: approximate numerics differ from float32 ({result.describe()})"
        )
    return result
