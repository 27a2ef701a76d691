"""int8 linears for the native engine: per-output-channel int8 weights, int32 accumulation.

Activations are quantized at run time: "per_token" (the default; one scale per token, on
oneDNN's int8 linear where torch has it) or "per_tensor" (fbgemm's dynamic linear; kept for
bench/int8_layers.py). `int8_model` quantizes the attention output and FFN intermediate
projections and keeps q/k/v and the FFN output projection in bfloat16 (float32 without it);
embeddings, pooler and heads stay float32. The twin check still decides per model.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch
from torch import nn

from vllm_srun.engines.native import packed
from vllm_srun.engines.native.modules import linears, replace

SCHEMES = ("per_token", "per_tensor")
# The projections that make queries, keys and values, as each architecture names them (BERT's
# fused `qkv`, ModernBERT's and NomicBERT's `Wqkv`, GTE's `qkv_proj`, DeBERTa's `query_proj`
# and its position projections, Qwen3's `q_proj`...).
ATTENTION_INPUTS = re.compile(r"(^|\.)(W?qkv|qkv_proj|(pos_)?(query|key|value)_proj|[qkv]_proj)$")
# The FFN's output projection (BERT's layer-level `output.dense`, DistilBERT's `ffn.lin2`,
# ModernBERT's `mlp.Wo`, NomicBERT's `mlp.fc2`, GTE's and Qwen3's `mlp.down_proj`): the next most
# sensitive in the per-layer table; its input is the activation's output, whose outlier
# dimensions a per-token scale spreads over every other dimension of the token.
FFN_OUTPUTS = re.compile(r"^(output\.dense|ffn\.lin2|mlp\.(Wo|fc2|down_proj))$")
BFLOAT16_KEPT = (ATTENTION_INPUTS, FFN_OUTPUTS)
# Symmetric int8 on [-127, 127]: -128 is left out so negating a value never overflows.
QMAX = 127.0


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 weight [out, in], float32 scale [out]) with weight ~= int8 * scale[:, None]."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / QMAX
    q = torch.round(w / scale[:, None]).clamp(-QMAX, QMAX).to(torch.int8)
    return q, scale


class Int8Linear(nn.Module):
    """A drop-in for `nn.Linear` (float32 in, float32 out) computing in int8.

    `weight_int8` (in oneDNN's int8 layout where torch has its int8 linear, packed.py; else
    [in, out], the layout `torch._int_mm` reads), `weight_scale` [out] and `bias` [out] are
    buffers: the module has no parameters, so nothing reloads into it."""

    def __init__(self, linear: nn.Linear, scheme: str = "per_token") -> None:
        super().__init__()
        if scheme not in SCHEMES:
            raise ValueError(f"int8 scheme {scheme!r} is not one of {', '.join(SCHEMES)}")
        self.scheme = scheme
        self.in_features, self.out_features = linear.in_features, linear.out_features
        q, scale = quantize_weight(linear.weight)
        bias = linear.bias.detach().float() if linear.bias is not None else torch.zeros(self.out_features)
        self.register_buffer("weight_scale", scale)
        self.register_buffer("bias", bias.clone())
        self._packed = None
        self.onednn = scheme == "per_token" and packed.int8_available()
        if self.onednn:
            self.register_buffer("weight_int8", packed.pack_int8(q))
            self.register_buffer("weight_zeros", torch.zeros(self.out_features, dtype=torch.long))
        elif scheme == "per_token":
            self.register_buffer("weight_int8", q.t().contiguous())
        else:
            zeros = torch.zeros(self.out_features, dtype=torch.long)
            qweight = torch._make_per_channel_quantized_tensor(q, scale.double(), zeros, 0)
            self._packed = torch.ops.quantized.linear_prepack(qweight, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).float()
        if self._packed is not None:
            out = torch.ops.quantized.linear_dynamic(x2, self._packed, False)
        else:
            out = self._per_token(x2)
        return out.view(*shape[:-1], self.out_features)

    def _per_token(self, x: torch.Tensor) -> torch.Tensor:
        # abs().amax() rather than linalg.vector_norm(inf), and the int32 result converted
        # before it is scaled rather than one mixed int32 x float32 multiply: both the faster
        # op on the CPU (bench/dtypes.py --profile). A scale and the bias are one addcmul
        # written over its own input: one pass over [tokens, out] fewer.
        amax = x.abs().amax(dim=1, keepdim=True).clamp_(min=1e-12)
        q = torch.mul(x, QMAX / amax).round_().to(torch.int8)
        if self.onednn:  # the channel scale applied inside the GEMM (packed.py)
            # As uint8, the int8 value + 128: flipping a byte's top bit adds 128 to it.
            q = q.view(torch.uint8).bitwise_xor_(0x80)
            out = packed.int8_linear(q, self.weight_int8, self.weight_scale, self.weight_zeros)
            return torch.addcmul(self.bias, out, amax.div_(QMAX), out=out)
        out = torch._int_mm(q, self.weight_int8).float().mul_(amax.div_(QMAX))
        return torch.addcmul(self.bias, out, self.weight_scale, out=out)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, scheme={self.scheme}"


class Bfloat16Linear(nn.Module):
    """A linear computed in bfloat16 (float32 accumulation inside the GEMM), read and returned
    in its caller's dtype: the layers around it (norms, rotary, position biases) stay float32.
    On oneDNN's linear where torch has it (packed.py), else `nn.functional.linear`."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = packed.available()
        weight = linear.weight.detach().to(torch.bfloat16)
        self.register_buffer("weight", packed.pack_weight(weight) if self.packed else weight.clone())
        bias = linear.bias.detach().to(torch.bfloat16).clone() if linear.bias is not None else None
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x16 = x.to(torch.bfloat16)
        if self.packed:
            out = packed.packed_linear(x16, self.weight, self.bias)
        else:
            out = nn.functional.linear(x16, self.weight, self.bias)
        return out.to(x.dtype)


def int8_model(
    blocks: Sequence[nn.Module],
    *,
    bfloat16: bool,
    scheme: str = "per_token",
    kept: Sequence[re.Pattern[str]] = BFLOAT16_KEPT,
) -> dict[str, str]:
    """Quantize the encoder layers `blocks` in place: attention's input projections to bfloat16
    (`bfloat16`, else left float32), every other linear to int8. Returns each linear's name
    (`<layer>.<path>`) and what it became."""
    done: dict[str, str] = {}
    for number, block in enumerate(blocks):
        for name, linear in list(linears(block)):
            if any(pattern.search(name) for pattern in kept):
                if bfloat16:
                    replace(block, name, Bfloat16Linear(linear))
                done[f"{number}.{name}"] = "bfloat16" if bfloat16 else "float32"
            else:
                replace(block, name, Int8Linear(linear, scheme))
                done[f"{number}.{name}"] = "int8"
    return done
