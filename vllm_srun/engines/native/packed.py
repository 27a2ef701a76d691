"""Linears on the CPU on oneDNN's own linear ops, with their weights laid out once at load.

bfloat16 and float32: `PackedLinear` on `torch.ops.mkldnn._linear_pointwise` (weight reordered
once, bias added to the float32 accumulator), for every linear inside the encoder layers; a
torch or CPU without the op keeps `nn.Linear` (for float32, MKL's slower GEMM). int8:
`int8_linear` on oneDNN's `qlinear_pointwise`, the per-channel scale applied inside,
activations as uint8 (`ZERO_POINT`), float32 out.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from vllm_srun.engines.native.modules import linears, replace


def _has(namespace: object, *ops: str) -> bool:
    """Whether oneDNN is enabled and this torch has every one of `ops` in `namespace`."""
    return torch.backends.mkldnn.is_available() and all(hasattr(namespace, op) for op in ops)


def _avx512() -> bool:
    """Whether this CPU has AVX-512 (F, BW, VL, DQ): oneDNN's bfloat16 and int8 linears refuse to
    run without it (a CPU with AVX2 only, where a test stands in bfloat16's flags)."""
    check = getattr(torch.cpu, "_is_avx512_supported", None)
    return bool(check()) if check is not None else True


def available() -> bool:
    """Whether this torch has oneDNN's linear (and oneDNN is enabled), and this CPU runs it."""
    return _has(torch.ops.mkldnn, "_linear_pointwise", "_reorder_linear_weight") and _avx512()


def pack_weight(weight: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """An [out, in] weight in `dtype` (bfloat16 or float32), in the layout oneDNN's linear reads
    (same shape and values)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(dtype).contiguous())


# Row counts above EXACT_ROWS are padded up to a multiple of ROW_BUCKET: oneDNN builds and caches
# a primitive per row count, and a server sees a new count with nearly every batch; fewer counts
# mean fewer primitives and fewer allocation sizes to fragment the heap (docs/performance.md).
# Up to EXACT_ROWS, lone rows, whose primitives are built at load, run as they are.
EXACT_ROWS = 128
ROW_BUCKET = 64


def bucket_rows(rows: int) -> int:
    """The row count oneDNN's linear runs `rows` rows at."""
    return rows if rows <= EXACT_ROWS else -(-rows // ROW_BUCKET) * ROW_BUCKET


# Activations oneDNN's linear applies to its float32 accumulator before writing the output (a
# post-op), by transformers' names: (the op's attribute, its algorithm).
POST_OPS: dict[str, tuple[str, str]] = {
    "gelu": ("gelu", "none"),
    "gelu_new": ("gelu", "tanh"),
    "gelu_fast": ("gelu", "tanh"),
    "gelu_pytorch_tanh": ("gelu", "tanh"),
    "relu": ("relu", ""),
}
NO_POST_OP = ("none", "")


def packed_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, post: tuple[str, str] = NO_POST_OP
) -> torch.Tensor:
    """post(x @ weight.T + bias) for `x` [..., in] and a `pack_weight` weight of x's dtype; `post`
    is a POST_OPS value, or none."""
    shape = x.shape
    flat = x.reshape(-1, shape[-1])
    rows = flat.shape[0]
    padded = bucket_rows(rows)
    if padded != rows:
        # Only the added rows are zeroed (torch's pad would fill the whole tensor first).
        grown = flat.new_empty(padded, shape[-1])
        grown[:rows].copy_(flat)
        grown[rows:].zero_()
        flat = grown
    attr, algorithm = post
    out = torch.ops.mkldnn._linear_pointwise(flat, weight, bias, attr, [], algorithm)
    return out[:rows].view(*shape[:-1], out.shape[-1])


def int8_available() -> bool:
    """Whether this torch has oneDNN's int8 linear, and this CPU runs it."""
    return _has(torch.ops.onednn, "qlinear_pointwise", "qlinear_prepack") and _avx512()


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
    """A drop-in for a bfloat16 or float32 `nn.Linear` on oneDNN's linear, in `dtype` (the
    linear's by default) in and out.

    `weight` (packed) and `bias` are buffers: the module has no parameters, so nothing
    reloads into it."""

    def __init__(self, linear: nn.Linear, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        dtype = dtype or linear.weight.dtype
        self.register_buffer("weight", pack_weight(linear.weight, dtype))
        bias = linear.bias.detach().to(dtype).clone() if linear.bias is not None else None
        self.register_buffer("bias", bias)
        # The activation applied to the output (`fuse`); the module that owns this linear then
        # skips its own.
        self.activation: str | None = None
        self.post = NO_POST_OP

    def fuse(self, activation: str) -> None:
        """Apply `activation` (a POST_OPS name) to the output, as oneDNN's post-op."""
        self.activation, self.post = activation, POST_OPS[activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return packed_linear(x, self.weight, self.bias, self.post)

    def extra_repr(self) -> str:
        kind = "bfloat16" if self.weight.dtype == torch.bfloat16 else "float32"
        fused = f", then {self.activation}" if self.activation else ""
        return f"in={self.in_features}, out={self.out_features}, oneDNN {kind}{fused}"


def applies_activation(linear: nn.Module) -> bool:
    """Whether `linear` applies its owner's activation itself (a fused `PackedLinear`)."""
    return isinstance(linear, PackedLinear) and linear.activation is not None


def fuse_activations(blocks: Sequence[nn.Module]) -> int:
    """Have each packed linear whose owner applies an activation after it (a module with
    `activation_name`, the name of its linear in `activation_input`) apply it as oneDNN's post-op
    instead: one pass fewer over the widest tensor of a layer. Returns how many were fused."""
    count = 0
    for block in blocks:
        for module in block.modules():
            name = getattr(module, "activation_name", None)
            linear = getattr(module, getattr(module, "activation_input", ""), None)
            if isinstance(linear, PackedLinear) and name in POST_OPS:
                linear.fuse(name)
                count += 1
    return count


def pack_linears(blocks: Sequence[nn.Module]) -> int:
    """Replace every `nn.Linear` inside the encoder layers `blocks` (bfloat16 or float32) by a
    `PackedLinear`, in place, activations fused where they can be (`fuse_activations`); returns
    how many linears (0 where this torch or CPU lacks the op)."""
    if not available():
        return 0
    count = 0
    for block in blocks:
        for name, linear in list(linears(block)):
            replace(block, name, PackedLinear(linear))
            count += 1
    fuse_activations(blocks)
    return count


def plain(linear: PackedLinear) -> nn.Linear:
    """The `nn.Linear` `linear` stands in for: its weight in the plain layout, its bias."""
    out = nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None)
    weight = linear.weight.to_dense()
    out.weight = nn.Parameter(weight, requires_grad=False)
    if linear.bias is not None:
        out.bias = nn.Parameter(linear.bias, requires_grad=False)
    return out.to(weight.dtype)


@contextmanager
def plain_linears(module: nn.Module) -> Iterator[nn.Module]:
    """`module` with every `PackedLinear` in it swapped for its `plain` linear until the block
    ends: for a tracer (the ONNX exporter), which cannot read oneDNN's packed layout."""
    swapped = [
        (name, replace(module, name, plain(child)))
        for name, child in list(module.named_modules())
        if isinstance(child, PackedLinear)
    ]
    try:
        yield module
    finally:
        for name, original in swapped:
            replace(module, name, original)
