"""Embedding output types, as sentence-transformers' `quantize_embeddings` quantizes them and
Cohere's `embedding_types` names them.

`binary`/`ubinary`: one bit per dimension (> 0), packed eight to a byte, most significant bit
first; `binary` is the byte less 128. `uint8`/`int8`: each component on 256 steps of its
dimension's calibration range `[lo, hi]` (the caller's), `int8` less 128.
"""

from __future__ import annotations

import base64
from typing import Any, Literal, get_args

import numpy as np

EmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary"]
EMBEDDING_TYPES: tuple[str, ...] = get_args(EmbeddingType)
# The types whose values depend on calibration ranges.
CALIBRATED = ("int8", "uint8")
# 256 levels: the step is a range's width over the 255 gaps between them.
LEVELS = 255


def ranges_of(calibration: np.ndarray) -> np.ndarray:
    """(2, d) float32: each dimension's minimum and maximum over the calibration vectors (rows)."""
    values = np.asarray(calibration, dtype=np.float32)
    if values.ndim != 2 or values.shape[0] == 0:
        raise ValueError(f"calibration must be a non-empty (n, d) matrix, not shape {values.shape}")
    return np.stack([values.min(axis=0), values.max(axis=0)]).astype(np.float32)


def quantize(vectors: np.ndarray, kind: str, ranges: np.ndarray | None = None) -> np.ndarray:
    """`vectors` (n, d) as `kind`: float32, int8, uint8, or packed bits (see the module doc).
    int8 and uint8 need `ranges` ((2, d), from `ranges_of`); a ValueError otherwise."""
    values = np.asarray(vectors, dtype=np.float32)
    if kind == "float":
        return values
    if kind in ("binary", "ubinary"):
        packed = np.packbits(values > 0, axis=-1)
        return packed if kind == "ubinary" else (packed.astype(np.int16) - 128).astype(np.int8)
    if kind not in CALIBRATED:
        raise ValueError(f"unknown embedding type {kind!r} (known: {', '.join(EMBEDDING_TYPES)})")
    if ranges is None or ranges.shape != (2, values.shape[-1]):
        raise ValueError(f"{kind} needs ranges of shape (2, {values.shape[-1]})")
    starts = ranges[0].astype(np.float32)
    steps = (ranges[1].astype(np.float32) - starts) / np.float32(LEVELS)
    steps = np.where(steps == 0, np.float32(1), steps)
    levels = np.clip(np.floor((values - starts) / steps), 0, LEVELS)
    out: np.ndarray = levels.astype(np.uint8) if kind == "uint8" else (levels - 128).astype(np.int8)
    return out


def as_json(quantized: np.ndarray) -> list[Any]:
    """Each row as JSON numbers: Python floats for float32, ints for the integer types."""
    rows: list[Any] = quantized.tolist()
    return rows


def as_base64(row: np.ndarray) -> str:
    """One row's bytes, base64: float32 little-endian, or one byte per int8/uint8/packed value."""
    if row.dtype == np.float32:
        row = row.astype("<f4")
    return base64.b64encode(row.tobytes()).decode("ascii")
