"""Fixture writer: `vllm-srun fixture OUT --family example_keywords` writes a small model."""

from __future__ import annotations

import json
from pathlib import Path

from vllm_sr_example import FORMAT, MODEL_FILE

_BASE = {
    "labels": ["billing", "shipping", "other"],
    "keywords": {"billing": ["refund", "invoice", "charge"], "shipping": ["parcel", "delivery"]},
}

VARIANTS = {
    "default": _BASE,
    # Serves classify only: the other surfaces answer 422 unsupported_surface.
    "classify-only": {**_BASE, "surfaces": ["classify"]},
    # Takes at most 5 words, so long inputs exercise options.overflow.
    "short": {**_BASE, "max_tokens": 5},
    # Declares itself batch-variant, so the coalescer's batching window applies.
    "batching": {**_BASE, "batch_invariant": False},
}


def write_fixture(out: Path, *, variant: str | None = None, onnx: bool = False) -> Path:
    """Write the `variant` model package into `out` and return its directory."""
    name = variant or "default"
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r} (variants: {', '.join(VARIANTS)})")
    if onnx:
        raise ValueError("example_keywords has no ONNX graph")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / MODEL_FILE).write_text(json.dumps({"format": FORMAT, **VARIANTS[name]}, indent=2) + "\n")
    return out
