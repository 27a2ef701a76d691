"""Qwen3 decoders (Qwen3-Embedding, Qwen3 rerankers as one-label classifiers or as causal LMs
scored by two vocabulary logits) over packed rows.

Each row attends causally to its own earlier tokens, so a packed row equals a batch of one.
Pre-RMSNorm layers, grouped key/value heads with per-head q/k RMSNorm before rotary, a SwiGLU
MLP, a final `norm`; `head_dim` comes from the config. Only default rotary and full attention
are implemented: anything else is refused by name. Attribute names follow the checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from vllm_srun.engines.native.attention import Layout
from vllm_srun.engines.native.encoder import Backbone, EncoderModel
from vllm_srun.engines.native.layers import activation, rotate_
from vllm_srun.errors import ConfigError

# Transformers' Qwen3Config default, for configs that name no theta at all.
_DEFAULT_THETA = 10_000.0
FULL = "full_attention"

Rope = tuple[torch.Tensor, torch.Tensor]


def rope_theta(config: Mapping[str, Any]) -> float:
    """The rotary base: `rope_parameters` (transformers 5) or the Hub's `rope_theta` and
    `rope_scaling`. A rope type other than the default is refused, naming it."""
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    for source in (params, scaling):
        kind = source.get("rope_type", source.get("type", "default"))
        if kind != "default":
            raise ConfigError(
                f"Qwen3 rope type {kind!r} is not supported: the native engine implements only the "
                "default rotary positions (rope_theta without scaling)"
            )
    return float(params.get("rope_theta", config.get("rope_theta", _DEFAULT_THETA)))


def head_dim(config: Mapping[str, Any]) -> int:
    return int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])


def _check_layers(config: Mapping[str, Any]) -> None:
    kinds = config.get("layer_types") or [FULL] * int(config["num_hidden_layers"])
    if config.get("use_sliding_window") or set(kinds) - {FULL}:
        raise ConfigError(
            f"Qwen3 layer types {sorted(set(kinds))} (use_sliding_window="
            f"{bool(config.get('use_sliding_window'))}): only full attention is supported"
        )
    if len(kinds) != int(config["num_hidden_layers"]):
        raise ConfigError(
            f"Qwen3 layer_types has {len(kinds)} entries for {config['num_hidden_layers']} layers"
        )


class Qwen3RMSNorm(nn.Module):
    """x / rms(x) in float32, cast back, then scaled by `weight` (as the reference orders it)."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class Qwen3Attention(nn.Module):
    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        if heads % kv_heads:
            raise ConfigError(
                f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
            )
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim(config)
        bias = bool(config.get("attention_bias", False))
        eps = float(config.get("rms_norm_eps", 1e-6))
        self.q_proj = nn.Linear(hidden, heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * self.head_dim, hidden, bias=bias)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps)

    def forward(self, x: torch.Tensor, layout: Layout, rope: Rope) -> torch.Tensor:
        n = x.shape[0]
        q = self.q_norm(self.q_proj(x).view(n, self.heads, self.head_dim))
        k = self.k_norm(self.k_proj(x).view(n, self.kv_heads, self.head_dim))
        v = self.v_proj(x).view(n, self.kv_heads, self.head_dim)
        cos, sin = rope
        # The default scale, 1/sqrt(head_dim), is the reference's.
        out = layout.attend(rotate_(q, cos, sin), rotate_(k, cos, sin), v, causal=True)
        return self.o_proj(out)  # type: ignore[no-any-return]


class Qwen3MLP(nn.Module):
    """SwiGLU: down_proj(act(gate_proj(x)) * up_proj(x))."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        hidden, inner = int(config["hidden_size"]), int(config["intermediate_size"])
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)
        self.act = activation(config.get("hidden_act", "silu"), in_place=True)  # on gate_proj's fresh output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)).mul_(self.up_proj(x)))  # type: ignore[no-any-return]


class Qwen3DecoderLayer(nn.Module):
    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        eps = float(config.get("rms_norm_eps", 1e-6))
        self.self_attn = Qwen3Attention(config)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(int(config["hidden_size"]), eps)
        self.post_attention_layernorm = Qwen3RMSNorm(int(config["hidden_size"]), eps)

    def forward(self, x: torch.Tensor, layout: Layout, rope: Rope) -> torch.Tensor:
        # Residuals added in place on each block's fresh output (addition commutes: same bits).
        x = self.self_attn(self.input_layernorm(x), layout, rope).add_(x)
        return self.mlp(self.post_attention_layernorm(x)).add_(x)  # type: ignore[no-any-return]


class Qwen3Backbone(Backbone):
    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        _check_layers(config)
        self.embed_tokens = nn.Embedding(int(config["vocab_size"]), int(config["hidden_size"]))
        self.layers = nn.ModuleList(
            Qwen3DecoderLayer(config) for _ in range(int(config["num_hidden_layers"]))
        )
        self.norm = Qwen3RMSNorm(int(config["hidden_size"]), float(config.get("rms_norm_eps", 1e-6)))
        dim = head_dim(config)
        # A plain host tensor, not a buffer: the module is built on the meta device and this is
        # not in the checkpoint.
        exponents = torch.arange(0, dim, 2, dtype=torch.float32, device="cpu") / dim
        self.inv_freq = 1.0 / (rope_theta(config) ** exponents)

    def embed(self, input_ids: torch.Tensor, type_ids: torch.Tensor | None, layout: Layout) -> torch.Tensor:
        return self.embed_tokens(input_ids)  # type: ignore[no-any-return]  # no token types

    @property
    def blocks(self) -> Sequence[nn.Module]:
        return self.layers

    def context(self, layout: Layout) -> Rope:
        """Rotary cos/sin [tokens, 1, head_dim] for the batch's positions (0 at each row's start:
        rotary scores depend only on the distance between positions, so a left-padded
        reference, whose positions start later, computes the same)."""
        positions = layout.positions
        freqs = positions[:, None].float() * self.inv_freq.to(positions.device)
        angles = torch.cat((freqs, freqs), dim=-1)[:, None, :]
        dtype = self.norm.weight.dtype
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def final(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)  # type: ignore[no-any-return]


class Qwen3(EncoderModel):
    """Qwen3: `model.embed_tokens`, `model.layers.N`, `model.norm`; heads by name
    (last_token_score for *ForSequenceClassification, score_token for *ForTokenClassification,
    logit_score for *ForCausalLM)."""

    prefix = "model"
    # A causal LM's vocabulary projection: no module takes it; the LogitScore head reads its rows.
    ignored = ("lm_head.",)
    input_embeddings = "embed_tokens.weight"

    def build(self, config: Mapping[str, Any]) -> Backbone:
        return Qwen3Backbone(config)
