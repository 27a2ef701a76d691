"""Pieces shared by the native architectures: activations, label counts, pooling, rotary."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F

from vllm_srun.engines.native.attention import Segments
from vllm_srun.errors import ConfigError

Activation = Callable[[torch.Tensor], torch.Tensor]

# Names as transformers' ACT2FN spells them. "gelu" is the exact erf form; the "new"/"fast"/
# "pytorch_tanh" variants are all the tanh approximation (equal to float rounding).
_ACTIVATIONS: dict[str, Activation] = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_fast": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
    "tanh": torch.tanh,
}


# The same functions writing into their input: for a fresh tensor nobody else holds (a linear's
# output), this saves allocating a second [tokens, intermediate] tensor, with the same bits.
_IN_PLACE: dict[str, Activation] = {
    "gelu": lambda x: torch.ops.aten.gelu_(x),
    "gelu_new": lambda x: torch.ops.aten.gelu_(x, approximate="tanh"),
    "gelu_fast": lambda x: torch.ops.aten.gelu_(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: torch.ops.aten.gelu_(x, approximate="tanh"),
    "relu": torch.relu_,
    "silu": lambda x: F.silu(x, inplace=True),
    "swish": lambda x: F.silu(x, inplace=True),
    "tanh": torch.tanh_,
}


def activation(name: str, *, in_place: bool = False) -> Activation:
    """The activation transformers' ACT2FN names `name`; `in_place` overwrites its argument."""
    try:
        return (_IN_PLACE if in_place else _ACTIVATIONS)[name]
    except KeyError:
        raise ConfigError(
            f"activation {name!r} is not supported (known: {', '.join(_ACTIVATIONS)})"
        ) from None


def num_labels(config: Mapping[str, Any]) -> int:
    """Labels as transformers counts them: id2label wins over num_labels; 2 when neither is set."""
    id2label = config.get("id2label")
    if id2label:
        return len(id2label)
    return int(config.get("num_labels", 2))


def mean_rows(hidden: torch.Tensor, segments: Segments, rows: list[int]) -> torch.Tensor:
    """Mean of each row's tokens, in float32 whatever the model dtype.

    One index_add over the batch (not an op per row); each row's sum still runs over its own
    tokens in order, whatever else is in the batch.
    """
    sums = torch.zeros(len(segments.lengths), hidden.shape[1], device=hidden.device)
    sums.index_add_(0, segments.row_ids, hidden.float())
    index = torch.as_tensor(rows, device=hidden.device)
    counts = torch.as_tensor([segments.lengths[r] for r in rows], device=hidden.device, dtype=torch.float32)
    return sums.index_select(0, index) / counts[:, None]


def first_tokens(hidden: torch.Tensor, segments: Segments, rows: list[int]) -> torch.Tensor:
    return hidden[[segments.starts[r] for r in rows]]


def rotate_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary positions (the rotate-half convention) applied to `x` in place and returned.

    The bits of the reference's `x * cos + rotate_half(x) * sin`, computed in the tables' dtype
    (float32 tables over a half-precision `x` compute in float32 and write back in x's dtype,
    as ModernBERT's reference does). `x` must be a fresh projection nobody else reads: writing
    into it makes one temporary instead of four, about 3x faster than the out-of-place sum.
    """
    half = x.shape[-1] // 2
    xf = x if x.dtype == cos.dtype else x.to(cos.dtype)
    rotated = torch.cat((xf[..., half:].neg(), xf[..., :half]), dim=-1).mul_(sin)
    out = xf.mul_(cos).add_(rotated)
    return x if out is x else x.copy_(out)
