"""Compact binary encoding of work-item results: float32 arrays, or an item error.

An array is `b"A"`, its rank (u8), its shape (u32 each) and float32 little-endian data; an
error is `b"E"` and its JSON. Redis stores these bytes; JSON floats never go through it.
"""

from __future__ import annotations

import struct
import time
from collections import OrderedDict

import msgspec
import numpy as np

from vllm_srun.plugins.base import ItemError, Result

_ARRAY = b"A"
_ERROR = b"E"


def encode_result(result: Result) -> bytes:
    if isinstance(result, ItemError):
        return _ERROR + msgspec.json.encode(result)
    array = np.asarray(result, dtype="<f4")  # tobytes() writes C order whatever the strides
    header = _ARRAY + struct.pack(f"<B{array.ndim}I", array.ndim, *array.shape)
    return header + array.tobytes()


def decode_result(raw: bytes) -> Result:
    kind = raw[:1]
    if kind == _ERROR:
        return msgspec.json.decode(raw[1:], type=ItemError)
    if kind != _ARRAY:
        raise ValueError(f"not an encoded result (starts with {kind!r})")
    ndim = raw[1]
    shape = struct.unpack_from(f"<{ndim}I", raw, 2)
    start = 2 + 4 * ndim
    return np.frombuffer(raw, dtype="<f4", offset=start).reshape(shape)


def cacheable(raw: bytes) -> bool:
    """Whether an encoded result may be cached: arrays are, item errors never (a retry may pass)."""
    return raw[:1] == _ARRAY


class LocalResults:
    """This process's most recent results, in front of the shared result cache in Redis.

    A cache key names its result for good (the model's digest, numerics, options and token ids
    are all in it), so a copy held here can never be stale; it only has to respect the same
    TTL as the Redis entry and a memory budget. A hit found here needs no Redis round trip:
    under load each await sends a request to the back of the event loop's queue, and the
    round trip was most of a cache hit's latency. Least recently used entries go first.
    """

    def __init__(self, max_bytes: int, ttl_s: float) -> None:
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.bytes = 0
        self._entries: OrderedDict[tuple[str, str], tuple[float, bytes]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, deployment: str, cache_key: str) -> bytes | None:
        key = (deployment, cache_key)
        entry = self._entries.get(key)
        if entry is None:
            return None
        if time.monotonic() - entry[0] > self.ttl_s:
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return entry[1]

    def put(self, deployment: str, cache_key: str, raw: bytes) -> None:
        """Keep an encoded array result (errors are never cached, here or in Redis)."""
        cost = _cost(cache_key, raw)
        if not cache_key or not cacheable(raw) or cost > self.max_bytes:
            return
        key = (deployment, cache_key)
        if key in self._entries:
            self._drop(key)
        self._entries[key] = (time.monotonic(), raw)
        self.bytes += cost
        while self.bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def _drop(self, key: tuple[str, str]) -> None:
        _, raw = self._entries.pop(key)
        self.bytes -= _cost(key[1], raw)


# Python's own cost of one entry beyond its key's and result's lengths: the tuples, float and
# dict slots, and the str and bytes headers. Without it a budget full of tiny classifier results
# would hold several times its size in memory.
_ENTRY_OVERHEAD = 384


def _cost(cache_key: str, raw: bytes) -> int:
    return _ENTRY_OVERHEAD + len(cache_key) + len(raw)
