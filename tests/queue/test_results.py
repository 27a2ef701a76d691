"""Results travel as float32 bytes, not JSON floats."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_srun.plugins.base import ItemError
from vllm_srun.queue.results import decode_result, encode_result


@pytest.mark.parametrize("shape", [(), (3,), (4, 5), (0, 2)])
def test_array_round_trip(shape: tuple[int, ...]) -> None:
    array = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    raw = encode_result(array)
    assert len(raw) == 2 + 4 * len(shape) + 4 * array.size
    decoded = decode_result(raw)
    assert isinstance(decoded, np.ndarray)
    np.testing.assert_array_equal(decoded, array)


def test_error_round_trip() -> None:
    error = ItemError("max_length_exceeded", "too long")
    assert decode_result(encode_result(error)) == error


def test_garbage_is_refused() -> None:
    with pytest.raises(ValueError):
        decode_result(b"Zjunk")
