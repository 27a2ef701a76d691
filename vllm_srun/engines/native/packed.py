"""Linears on the CPU on oneDNN's own linear ops, with their weights laid out once at load.

`nn.functional.linear` in bfloat16 on the CPU first copies the broadcast bias into the output
and then multiplies onto it, and lays the weight out again on every call. oneDNN's linear
(`torch.ops.mkldnn._linear_pointwise`, what torch.compile's CPU backend calls for a linear)
takes a weight reordered once at load (`_reorder_linear_weight`) and adds the bias to the
float32 accumulator before rounding to bfloat16: no pass over the [tokens, out] output
besides the GEMM's own, and the same accumulation in float32 as before.

Used where the module is bfloat16 on a CPU with bfloat16 instructions (the engine refuses
bfloat16 elsewhere): every linear inside the encoder layers, and the bfloat16 linears that
int8 keeps (quantize.Bfloat16Linear). A torch without the op keeps `nn.Linear`.

int8 (quantize.Int8Linear): oneDNN's int8 linear (`torch.ops.onednn.qlinear_pointwise`, what
torch's x86 int8 quantization lowers to) on a weight reordered once, with the per-channel
weight scale applied inside and a float32 result, instead of `torch._int_mm`, which lays the
weight out on every call and returns int32 that is converted and scaled in passes of its own.
The activation scale it takes is one per tensor, so it is given 1 and the per-token scales are
applied after, with the bias, in one pass; the activations go in as uint8 (`ZERO_POINT`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


def _has(namespace: object, *ops: str) -> bool:
    """Whether oneDNN is enabled and this torch has every one of `ops` in `namespace`."""
    return torch.backends.mkldnn.is_available() and all(hasattr(namespace, op) for op in ops)


def available() -> bool:
    """Whether this torch has oneDNN's linear (and oneDNN is enabled)."""
    return _has(torch.ops.mkldnn, "_linear_pointwise", "_reorder_linear_weight")


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """A bfloat16 [out, in] weight in the layout oneDNN's linear reads (same shape and values)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(torch.bfloat16).contiguous())


def packed_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, post_op: tuple[str, str] = ("none", "")
) -> torch.Tensor:
    """x @ weight.T + bias for bfloat16 `x` [..., in] and a `pack_weight` weight, then `post_op`
    (oneDNN's name for an activation and its algorithm, see `FUSED_ACTIVATIONS`) on the float32
    accumulator before it is rounded to bfloat16."""
    shape = x.shape
    attr, algorithm = post_op
    out = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, shape[-1]), weight, bias, attr, [], algorithm)
    return out.view(*shape[:-1], out.shape[-1])


def packed_linear_add(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, other: torch.Tensor
) -> torch.Tensor:
    """x @ weight.T + bias + other in one pass: oneDNN adds `other` (bfloat16, the output's
    shape) to the float32 accumulator and rounds once, where a separate add would round the
    linear's output first and then read and write the whole [tokens, out] tensor again."""
    shape = x.shape
    flat = x.reshape(-1, shape[-1])
    out = torch.ops.mkldnn._linear_pointwise.binary(flat, other.reshape(flat.shape[0], -1), weight, bias, "add")
    return out.view(*shape[:-1], out.shape[-1])


# The transformers activations (layers.py's names) oneDNN's linear can apply itself, as
# (post-op, algorithm): the activation then costs no pass of its own over the [tokens,
# intermediate] output, the widest tensor of a layer (a sixth of a MiniLM bfloat16 forward on
# this CPU when it was separate; docs/performance.md).
FUSED_ACTIVATIONS: dict[str, tuple[str, str]] = {
    "gelu": ("gelu", "none"),
    "gelu_new": ("gelu", "tanh"),
    "gelu_fast": ("gelu", "tanh"),
    "gelu_pytorch_tanh": ("gelu", "tanh"),
    "relu": ("relu", ""),
}


def int8_available() -> bool:
    """Whether this torch has oneDNN's int8 linear."""
    return _has(torch.ops.onednn, "qlinear_pointwise", "qlinear_prepack")


def pack_int8(weight: torch.Tensor) -> torch.Tensor:
    """An int8 [out, in] weight in the layout oneDNN's int8 linear reads."""
    return torch.ops.onednn.qlinear_prepack(weight.contiguous(), None)


# The activations go to oneDNN's int8 linear as uint8 with a zero point of 128 (a symmetric
# int8 value plus 128): a CPU with VNNI and no AMX multiplies only unsigned by signed bytes, and
# there oneDNN runs a signed activation on its reference kernel, orders of magnitude slower
# (docs/performance.md has the figures). The result is the same: oneDNN subtracts the zero
# point's share from the int32 sum exactly.
ZERO_POINT = 128


def int8_linear(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, zeros: torch.Tensor
) -> torch.Tensor:
    """(x - ZERO_POINT) @ weight.T * scale in float32, for uint8 `x` [tokens, in] (a symmetric int8
    value plus `ZERO_POINT`), a `pack_int8` weight and its float32 per-channel `scale`
    (symmetric: `zeros` are 0)."""
    return torch.ops.onednn.qlinear_pointwise(
        x, 1.0, ZERO_POINT, weight, scale, zeros, None, 1.0, 0, torch.float32, "none", [], ""
    )


class PackedLinear(nn.Module):
    """A drop-in for a bfloat16 `nn.Linear` (bfloat16 in, bfloat16 out) on oneDNN's linear.

    `weight` (packed) and `bias` are buffers: the module has no parameters, so nothing
    reloads into it."""

    # The activation oneDNN applies to the output (`fuse`); none until a block asks.
    activation: str | None = None

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("weight", pack_weight(linear.weight))
        bias = linear.bias.detach().to(torch.bfloat16).clone() if linear.bias is not None else None
        self.register_buffer("bias", bias)
        self._post_op = ("none", "")

    def fuse(self, activation: str) -> bool:
        """Apply the activation `activation` (layers.py's name) inside the GEMM from now on;
        False, and nothing changed, where oneDNN has no such post-op."""
        post_op = FUSED_ACTIVATIONS.get(activation)
        if post_op is None:
            return False
        self.activation, self._post_op = activation, post_op
        return True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return packed_linear(x, self.weight, self.bias, self._post_op)

    def plus(self, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        """forward(x) + other, the add inside the GEMM (`packed_linear_add`)."""
        assert self.activation is None, "an add after a fused activation is not this op"
        return packed_linear_add(x, self.weight, self.bias, other)

    def extra_repr(self) -> str:
        fused = f", then {self.activation}" if self.activation else ""
        return f"in={self.in_features}, out={self.out_features}, oneDNN bfloat16{fused}"


def pack_linears(blocks: Sequence[nn.Module], *, fuse: bool = True) -> int:
    """Replace every `nn.Linear` inside the bfloat16 encoder layers `blocks` by a
    `PackedLinear`, in place; returns how many (0 where this torch lacks the op). With `fuse`,
    each submodule that has a `fuse_packed()` method is then asked to move what follows its
    linear (an activation, a residual add) into it."""
    from vllm_srun.engines.native.quantize import linears, replace  # quantize imports this module

    if not available():
        return 0
    count = 0
    for block in blocks:
        for name, linear in list(linears(block)):
            replace(block, name, PackedLinear(linear))
            count += 1
        for module in block.modules() if fuse else ():
            fuse_packed = getattr(module, "fuse_packed", None)
            if callable(fuse_packed):
                fuse_packed()
    return count
