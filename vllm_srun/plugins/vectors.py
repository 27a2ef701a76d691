"""Small numeric helpers families share: softmax, normalisation, OpenAI embedding encoding."""

from __future__ import annotations

import base64

import numpy as np


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.asarray(logits, dtype=np.float64) - np.max(logits)
    exp = np.exp(shifted)
    out: np.ndarray = exp / exp.sum()
    return out


def sigmoid(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))
    return out


def l2_normalize(vector: np.ndarray) -> np.ndarray:
    """The unit vector along `vector`; a zero vector stays zero."""
    v = np.asarray(vector, dtype=np.float32)
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0 else v


def embedding_value(
    vector: np.ndarray, *, encoding_format: str = "float", dimensions: int | None = None
) -> list[float] | str:
    """An embedding as OpenAI returns it: a float list, or base64 of float32 little-endian.

    `dimensions` keeps the leading components (Matryoshka) and renormalises them.
    """
    v = np.asarray(vector, dtype=np.float32)
    if dimensions is not None and dimensions < v.shape[0]:
        v = l2_normalize(v[:dimensions])
    if encoding_format == "base64":
        return base64.b64encode(v.astype("<f4").tobytes()).decode("ascii")
    return [float(x) for x in v]
