"""Golden readiness: does a loaded model still give the answers recorded for it?

`run_golden` runs each recorded request in-process, the way a request is served (plan ->
one forward -> finish), and compares the response with the record: numbers within the
record's `atol` (1e-3 by default), embeddings by cosine similarity >= 1 - atol, everything
else exactly, and only the keys the record names. Without a record for the device class it
runs one request twice and checks that the answers agree: the model is then `unverified`,
not failed. A DecisionModel must also pass its own `self_check`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
import numpy as np

from vllm_srun.plugins.base import LoadedModel
from vllm_srun.plugins.decisions import SELF_CHECK_REQUEST, DecisionModel
from vllm_srun.plugins.surfaces import REGISTRY
from vllm_srun.queue.planning import with_overflow
from vllm_srun.registry.tables import GoldenRecord

Status = Literal["verified", "unverified", "failed"]

# What the determinism check asks when a model has no record for its device class.
PROBE_REQUESTS: dict[str, dict[str, Any]] = {
    "classify": {"input": ["The service was good and fast.", "A terrible film."]},
    "embeddings": {"input": ["The service was good and fast.", "A terrible film."]},
    "rerank": {"query": "good service", "documents": ["The service was good.", "A terrible film."]},
    "decisions": SELF_CHECK_REQUEST,
}
# The classify probe of a head that takes pairs only.
PAIR_PROBE = (("good service", "The service was good."), ("good service", "A terrible film."))
DEFAULT_ATOL = 1e-3


@dataclass(frozen=True)
class GoldenResult:
    """`verified`: every record matched; `unverified`: no record, but deterministic;
    `failed`: a record did not match, the model is not deterministic, or it could not run."""

    status: Status
    reason: str | None = None


def device_class_of(device: str) -> str:
    """The device class records are kept under: "cuda:1" -> "cuda", "cpu" -> "cpu"."""
    return device.partition(":")[0]


def answer(model: LoadedModel, surface: str, request: Mapping[str, Any]) -> Any:
    """The JSON-able response of `model` to one surface request, computed in-process.

    The request is decoded by its surface's descriptor, as the surface's routes decode bodies."""
    # Long inputs as a request that names no overflow gets them on our own surfaces.
    decoded = with_overflow(model, surface, REGISTRY.get(surface).decode(dict(request)), "reject")
    plan = model.plan_surface(surface, decoded)
    results = model.run(plan.items) if plan.items else []
    return msgspec.to_builtins(model.finish_surface(plan, results))


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    norms = float(np.linalg.norm(x) * np.linalg.norm(y))
    return float(np.dot(x, y) / norms) if norms > 0 else float(np.allclose(x, y))


def compare(expected: Any, actual: Any, *, atol: float = DEFAULT_ATOL, path: str = "$") -> str | None:
    """Where `actual` departs from the subset `expected`, or None when it matches."""
    if isinstance(expected, Mapping):
        if not isinstance(actual, Mapping):
            return f"{path}: expected an object, got {type(actual).__name__}"
        for key, value in expected.items():
            if key not in actual:
                return f"{path}.{key}: missing from the response"
            mismatch = compare(value, actual[key], atol=atol, path=f"{path}.{key}")
            if mismatch is not None:
                return mismatch
        return None
    if isinstance(expected, list | tuple):
        if not isinstance(actual, list | tuple) or len(actual) != len(expected):
            got = len(actual) if isinstance(actual, list | tuple) else type(actual).__name__
            return f"{path}: expected {len(expected)} entries, got {got}"
        vector = path.endswith(".embedding") and all(_is_number(v) for v in (*expected, *actual))
        if vector and not all(math.isfinite(v) for v in actual):
            return f"{path}: the model answers NaN or infinite values (check the weights)"
        if vector and expected:
            similarity = _cosine(expected, actual)
            return None if similarity >= 1 - atol else f"{path}: cosine {similarity:.6f} < {1 - atol}"
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            mismatch = compare(e, a, atol=atol, path=f"{path}[{i}]")
            if mismatch is not None:
                return mismatch
        return None
    if _is_number(expected) and _is_number(actual):
        if not math.isfinite(actual):
            return f"{path}: the model answers {actual} (NaN or infinite outputs: check the weights)"
        close = abs(float(actual) - float(expected)) <= atol
        return None if close else f"{path}: expected {expected}, got {actual} (atol {atol})"
    return None if expected == actual else f"{path}: expected {expected!r}, got {actual!r}"


def _records(
    records: Mapping[str, Sequence[GoldenRecord]] | Sequence[GoldenRecord] | None, device_class: str
) -> Sequence[GoldenRecord]:
    if records is None:
        return ()
    if isinstance(records, Mapping):
        return records.get(device_class, ())
    return records


def run_golden(
    model: LoadedModel,
    records: Mapping[str, Sequence[GoldenRecord]] | Sequence[GoldenRecord] | None,
    *,
    device_class: str,
) -> GoldenResult:
    """Warm `model` on its recorded answers for `device_class` (see the module docstring).

    `records` is a BuiltinModel's `golden` mapping (device class -> records), a plain list of
    records, or None. Never raises for a model's own failure: that is a `failed` result.
    """
    if model.engine_model is None:
        return GoldenResult("unverified", "loaded without an engine: nothing to run here")
    if isinstance(model, DecisionModel):
        reason = model.self_check()
        if reason is not None:
            return GoldenResult("failed", reason)
    selected = _records(records, device_class)
    try:
        if selected:
            return _verify(model, selected, device_class)
        return _determinism(model, device_class)
    except Exception as exc:  # the model's failure to answer is the reason it is not ready
        return GoldenResult("failed", f"{type(exc).__name__}: {exc}")


def _verify(model: LoadedModel, records: Sequence[GoldenRecord], device_class: str) -> GoldenResult:
    for i, record in enumerate(records):
        if record.surface not in model.info.surfaces:
            return GoldenResult(
                "failed", f"golden record {i} asks for {record.surface!r}, which the model does not serve"
            )
        body = answer(model, record.surface, record.request)
        mismatch = compare(record.expected, body, atol=record.atol)
        if mismatch is not None:
            return GoldenResult("failed", f"golden record {i} ({record.surface}, {device_class}): {mismatch}")
    return GoldenResult("verified", f"{len(records)} golden record(s) matched on {device_class}")


def _determinism(model: LoadedModel, device_class: str) -> GoldenResult:
    surface = next((s for s in model.info.surfaces if s in PROBE_REQUESTS), None)
    if surface is None:
        return GoldenResult("unverified", f"no golden records for {device_class} and no probe request")
    request = PROBE_REQUESTS[surface]
    if surface == "classify" and model.info.heads and model.info.heads[0].inputs == ["pair"]:
        # A pair scorer that takes pairs only (a LogitScore reranker's chat template).
        request = {"input": [{"text": t, "text_pair": p} for t, p in PAIR_PROBE]}
    if surface == "embeddings" and model.info.outputs:
        # The first kind the model gives, which is its default where its engine gives that (a
        # SPLADE package whose graph has no masked-LM logits gives tokens only).
        request = {**request, "options": {"output": model.info.outputs[0]}}
    first = answer(model, surface, request)
    second = answer(model, surface, request)
    mismatch = compare(first, second, atol=DEFAULT_ATOL)
    if mismatch is not None:
        return GoldenResult("failed", f"the same {surface} request answered differently twice: {mismatch}")
    return GoldenResult("unverified", f"no golden records for {device_class}; answers are deterministic")
