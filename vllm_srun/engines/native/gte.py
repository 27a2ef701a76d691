"""GTE (gte-*-v1.5, gte-multilingual) over packed rows, as Transformers' `GteModel` computes it.

NomicBERT's network with biases: word (and, where the config has any, token type) embeddings
normalised by `embeddings.LayerNorm`, no absolute positions, rotary q/k (rotate-half over the
whole head, theta from `rope_parameters`, 160000 by default), post-LayerNorm layers
(`attn_ln`, `mlp_ln`), biased q/k/v/o projections and a gated MLP whose fused `up_gate_proj`
(up, then gate) has no bias while `down_proj` has one. Attribute names follow the checkpoint
as Transformers saves it (the Hub's own names: `encoder.layer.N.attention.qkv_proj`, ...).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from vllm_srun.engines.native.attention import Layout
from vllm_srun.engines.native.encoder import Backbone, EncoderModel
from vllm_srun.engines.native.layers import activation
from vllm_srun.engines.native.nomic_bert import (
    Rope,
    attend_rotary,
    head_dim,
    inverse_frequencies,
    refuse_unsupported,
    rope_theta,
    rotary_tables,
    swiglu,
)

# Settings of the original remote-code configs that change the network, with the one value
# implemented here (as Transformers' GteModel implements it).
_FIXED = {
    "position_embedding_type": "rope",
    "layer_norm_type": "layer_norm",
    "logn_attention_scale": False,
    "logn_attention_clip1": False,
    "partial_rotary_factor": 1.0,
}


class GteEmbeddings(nn.Module):
    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        hidden, types = config["hidden_size"], int(config.get("type_vocab_size", 1) or 0)
        self.word_embeddings = nn.Embedding(config["vocab_size"], hidden)
        # gte-base-en-v1.5 has no token types at all (type_vocab_size 0): no table, no term.
        self.token_type_embeddings = nn.Embedding(types, hidden) if types else None
        self.LayerNorm = nn.LayerNorm(hidden, eps=config.get("layer_norm_eps", 1e-12))

    def forward(self, input_ids: torch.Tensor, type_ids: torch.Tensor | None) -> torch.Tensor:
        x = self.word_embeddings(input_ids)
        types = self.token_type_embeddings
        if types is not None:
            x = x + (types.weight[0] if type_ids is None else types(type_ids))
        return self.LayerNorm(x)  # type: ignore[no-any-return]


class GteAttention(nn.Module):
    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        self.heads = config["num_attention_heads"]
        width = self.heads * head_dim(config)
        self.qkv_proj = nn.Linear(config["hidden_size"], 3 * width)
        self.o_proj = nn.Linear(width, config["hidden_size"])

    def forward(self, x: torch.Tensor, rope: Rope, layout: Layout) -> torch.Tensor:
        return self.o_proj(attend_rotary(self.qkv_proj(x), self.heads, rope, layout))  # type: ignore[no-any-return]


class GteMLP(nn.Module):
    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        hidden, inner = config["hidden_size"], config["intermediate_size"]
        self.up_gate_proj = nn.Linear(hidden, 2 * inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden)
        self.act = activation(config.get("hidden_act", "gelu"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(swiglu(self.up_gate_proj(x), self.act))  # type: ignore[no-any-return]


class GteLayer(nn.Module):
    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        eps = config.get("layer_norm_eps", 1e-12)
        self.attention = GteAttention(config)
        self.attn_ln = nn.LayerNorm(config["hidden_size"], eps=eps)
        self.mlp = GteMLP(config)
        self.mlp_ln = nn.LayerNorm(config["hidden_size"], eps=eps)

    def forward(self, x: torch.Tensor, layout: Layout, rope: Rope) -> torch.Tensor:
        # Residuals added in place on each block's fresh output (addition commutes: same bits).
        x = self.attn_ln(self.attention(x, rope, layout).add_(x))
        return self.mlp_ln(self.mlp(x).add_(x))  # type: ignore[no-any-return]


class GteEncoder(nn.Module):
    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        self.layer = nn.ModuleList(GteLayer(config) for _ in range(config["num_hidden_layers"]))


class GteBackbone(Backbone):
    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        refuse_unsupported(config, "GTE", _FIXED)
        self.embeddings = GteEmbeddings(config)
        self.encoder = GteEncoder(config)
        self.inv_freq = inverse_frequencies(head_dim(config), rope_theta(config, "GTE", 160_000.0))

    def embed(self, input_ids: torch.Tensor, type_ids: torch.Tensor | None, layout: Layout) -> torch.Tensor:
        return self.embeddings(input_ids, type_ids)  # type: ignore[no-any-return]

    @property
    def blocks(self) -> Sequence[nn.Module]:
        return self.encoder.layer

    def context(self, layout: Layout) -> Rope:
        return rotary_tables(self.inv_freq, layout)


class Gte(EncoderModel):
    """GTE: `gte.embeddings`, `gte.encoder.layer.N`; heads by name (pooler, token)."""

    prefix = "gte"
    optional = ("pooler.",)
    ignored = ("lm_head.",)  # *ForMaskedLM's prediction head

    def build(self, config: Mapping[str, Any]) -> Backbone:
        return GteBackbone(config)
