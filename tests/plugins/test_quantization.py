"""Output quantization against sentence-transformers' `quantize_embeddings`, the reference.

Every comparison is exact: both sides compute the same float32 expressions (the step, the
floor, the clip) or the same bit packing, so any difference is a different rule, not rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

from vllm_srun.plugins.embedding_types import EMBEDDING_TYPES, quantize, ranges_of

quantization = pytest.importorskip("sentence_transformers.util.quantization")
reference = quantization.quantize_embeddings


def vectors(rows: int, dimension: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out: np.ndarray = rng.standard_normal((rows, dimension)).astype(np.float32)
    return out / np.linalg.norm(out, axis=1, keepdims=True)


@pytest.mark.parametrize("kind", ["binary", "ubinary"])
@pytest.mark.parametrize("dimension", [384, 13])  # 13: a last byte padded with zero bits
def test_binary_types_are_bit_for_bit(kind: str, dimension: int) -> None:
    values = vectors(50, dimension, seed=1)
    values[0, :5] = 0.0  # exactly 0 is not > 0: its bit is clear on both sides
    ours = quantize(values, kind)
    theirs = reference(values, precision=kind)
    assert ours.dtype == theirs.dtype and ours.shape == (50, (dimension + 7) // 8)
    assert np.array_equal(ours, theirs)


@pytest.mark.parametrize("kind", ["int8", "uint8"])
def test_integer_types_equal_the_reference_given_the_same_calibration(kind: str) -> None:
    calibration, served = vectors(256, 64, seed=2), vectors(40, 64, seed=3)
    ranges = ranges_of(calibration)
    ours = quantize(served, kind, ranges)
    assert ours.dtype == np.dtype(kind)
    # The same ranges given, and the ranges the reference derives from the same calibration.
    assert np.array_equal(ours, reference(served, precision=kind, ranges=ranges))
    assert np.array_equal(ours, reference(served, precision=kind, calibration_embeddings=calibration))
    # Values outside the calibration ranges clip to the ends, as the reference's do.
    outside = quantize(served * 10, kind, ranges)
    assert np.array_equal(outside, reference(served * 10, precision=kind, ranges=ranges))
    low, high = (-128, 127) if kind == "int8" else (0, 255)
    assert outside.min() == low and outside.max() == high


def test_a_text_s_values_do_not_depend_on_its_batch() -> None:
    """The reason for fixed ranges: without them the reference quantizes a vector differently
    in different company; with the model's ranges a vector's values are its own."""
    calibration, served = vectors(256, 32, seed=4), vectors(8, 32, seed=5)
    ranges = ranges_of(calibration)
    assert np.array_equal(quantize(served[:1], "int8", ranges), quantize(served, "int8", ranges)[:1])
    in_two, in_eight = reference(served[:2], precision="int8"), reference(served, precision="int8")
    assert not np.array_equal(in_two[0], in_eight[0])


def test_a_constant_dimension_and_bad_arguments() -> None:
    calibration = vectors(16, 8, seed=6)
    calibration[:, 3] = 0.5  # a point range: a step of 1, as the reference takes it
    ranges = ranges_of(calibration)
    served = vectors(4, 8, seed=7)
    assert np.array_equal(
        quantize(served, "uint8", ranges), reference(served, precision="uint8", ranges=ranges)
    )
    with pytest.raises(ValueError, match="needs ranges"):
        quantize(served, "int8")
    with pytest.raises(ValueError, match="unknown embedding type 'int4'"):
        quantize(served, "int4")
    with pytest.raises(ValueError, match="non-empty"):
        ranges_of(np.zeros((0, 8)))
    assert EMBEDDING_TYPES == ("float", "int8", "uint8", "binary", "ubinary")
    assert np.array_equal(quantize(served, "float"), served)
