"""Results travel as float32 bytes, not JSON floats."""

from __future__ import annotations

import time

import numpy as np
import pytest

from vllm_srun.plugins.base import ItemError
from vllm_srun.queue.results import LocalResults, decode_result, encode_result


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


def test_local_results_keep_arrays_within_the_budget_least_recent_first() -> None:
    one = encode_result(np.zeros(100, dtype=np.float32))
    probe = LocalResults(max_bytes=1 << 20, ttl_s=60)
    probe.put("m", "a", one)
    entry = probe.bytes  # what one entry counts: its result, its key, and Python's overhead
    assert entry > len(one) + 256
    local = LocalResults(max_bytes=3 * entry, ttl_s=60)
    for key in ("a", "b", "c"):
        local.put("m", key, one)
    assert local.get("m", "a") == one  # "a" is now the most recent
    local.put("m", "d", one)
    assert local.get("m", "b") is None and local.get("m", "a") == one
    assert len(local) == 3 and local.bytes == 3 * entry
    assert local.get("other-deployment", "a") is None
    local.put("m", "big", encode_result(np.zeros(1000, dtype=np.float32)))  # over the whole budget
    assert local.get("m", "big") is None and len(local) == 3


def test_local_results_never_keep_errors_or_expired_entries() -> None:
    local = LocalResults(max_bytes=1 << 20, ttl_s=0.05)
    local.put("m", "err", encode_result(ItemError("forward_failed", "boom")))
    local.put("m", "x", encode_result(np.ones(3, dtype=np.float32)))
    assert local.get("m", "err") is None and local.get("m", "x") is not None
    time.sleep(0.06)
    assert local.get("m", "x") is None and local.bytes == 0
