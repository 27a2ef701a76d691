"""Compact binary encoding of work-item results: float32 arrays, or an item error.

An array is `b"A"`, its rank (u8), its shape (u32 each) and float32 little-endian data; an
error is `b"E"` and its JSON. Redis stores these bytes; JSON floats never go through it.
"""

from __future__ import annotations

import struct

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
