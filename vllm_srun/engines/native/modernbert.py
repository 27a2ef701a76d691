"""ModernBERT (and mmBERT, the same network with another vocabulary) over packed rows.

Pre-LayerNorm layers with rotary positions; every `global_attn_every_n_layers`-th layer (from
layer 0) attends over the whole row, the others within +-local_attention/2 tokens, each kind
with its own rope theta. GeGLU MLP. Biases follow the config's norm_bias, attention_bias,
mlp_bias and classifier_bias flags. Attribute names follow the checkpoint.
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

FULL, SLIDING = "full_attention", "sliding_attention"
_DEFAULT_THETA = {FULL: 160_000.0, SLIDING: 10_000.0}
_LEGACY_THETA_KEY = {FULL: "global_rope_theta", SLIDING: "local_rope_theta"}


def layer_types(config: Mapping[str, Any]) -> list[str]:
    """Per-layer attention kind: transformers 5 writes `layer_types`; older configs an interval."""
    explicit = config.get("layer_types")
    if explicit:
        return list(explicit)
    every = int(config.get("global_attn_every_n_layers", 3))
    return [FULL if i % every == 0 else SLIDING for i in range(config["num_hidden_layers"])]


def rope_theta(config: Mapping[str, Any], kind: str) -> float:
    """Theta for one layer kind, from `rope_parameters[kind]` (transformers 5) or the legacy keys."""
    params = (config.get("rope_parameters") or {}).get(kind) or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise ConfigError(f"ModernBERT rope_type {rope_type!r} is not supported (only 'default')")
    return float(params.get("rope_theta", config.get(_LEGACY_THETA_KEY[kind], _DEFAULT_THETA[kind])))


def _layer_norm(config: Mapping[str, Any]) -> nn.LayerNorm:
    return nn.LayerNorm(
        config["hidden_size"], eps=config.get("norm_eps", 1e-5), bias=config.get("norm_bias", False)
    )


class ModernBertEmbeddings(nn.Module):
    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(config["vocab_size"], config["hidden_size"])
        self.norm = _layer_norm(config)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.norm(self.tok_embeddings(input_ids))


class ModernBertAttention(nn.Module):
    def __init__(self, config: Mapping[str, Any], window: int | None) -> None:
        super().__init__()
        hidden, heads = config["hidden_size"], config["num_attention_heads"]
        if hidden % heads:
            raise ConfigError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
        bias = config.get("attention_bias", False)
        self.heads, self.window = heads, window
        self.Wqkv = nn.Linear(hidden, 3 * hidden, bias=bias)
        self.Wo = nn.Linear(hidden, hidden, bias=bias)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], layout: Layout) -> torch.Tensor:
        qkv = self.Wqkv(x).view(x.shape[0], 3, self.heads, -1)
        # q and k rotate together (one op set for both), written back into the fresh qkv.
        rotate_(qkv[:, :2], *rope)
        return self.Wo(layout.attend(qkv, window=self.window))


class ModernBertMLP(nn.Module):
    """GeGLU: the first half of Wi's output, activated, gates the second half."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        hidden, inner, bias = (
            config["hidden_size"],
            config["intermediate_size"],
            config.get("mlp_bias", False),
        )
        self.Wi = nn.Linear(hidden, 2 * inner, bias=bias)
        self.Wo = nn.Linear(inner, hidden, bias=bias)
        self.act = activation(config.get("hidden_activation", "gelu"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inp, gate = self.Wi(x).chunk(2, dim=-1)
        return self.Wo(self.act(inp) * gate)


class ModernBertEncoderLayer(nn.Module):
    def __init__(self, config: Mapping[str, Any], index: int, kind: str) -> None:
        super().__init__()
        self.kind = kind
        # Layer 0's input is already the normalised embedding: it has no attn_norm.
        self.attn_norm = _layer_norm(config) if index else nn.Identity()
        window = int(config.get("local_attention", 128)) // 2 if kind == SLIDING else None
        self.attn = ModernBertAttention(config, window)
        self.mlp_norm = _layer_norm(config)
        self.mlp = ModernBertMLP(config)

    def forward(self, x: torch.Tensor, layout: Layout, rope: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        # Residuals added in place on each block's fresh output (addition commutes: same bits).
        x = self.attn(self.attn_norm(x), rope[self.kind], layout).add_(x)
        return self.mlp(self.mlp_norm(x)).add_(x)


class ModernBertBackbone(Backbone):
    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        kinds = layer_types(config)
        if len(kinds) != config["num_hidden_layers"] or set(kinds) - {FULL, SLIDING}:
            raise ConfigError(f"ModernBERT layer_types {kinds!r} do not match num_hidden_layers")
        self.embeddings = ModernBertEmbeddings(config)
        self.kinds = kinds
        self.layers = nn.ModuleList(ModernBertEncoderLayer(config, i, kind) for i, kind in enumerate(kinds))
        self.final_norm = _layer_norm(config)
        head_dim = config["hidden_size"] // config["num_attention_heads"]
        # Plain host tensors, not buffers: the module is built on the meta device (hence the
        # explicit device) and these are not in the checkpoint.
        exponents = torch.arange(0, head_dim, 2, dtype=torch.float32, device="cpu") / head_dim
        self.inv_freq = {kind: 1.0 / (rope_theta(config, kind) ** exponents) for kind in set(kinds)}

    def embed(self, input_ids: torch.Tensor, type_ids: torch.Tensor | None, layout: Layout) -> torch.Tensor:
        return self.embeddings(input_ids)  # type: ignore[no-any-return]  # no token types

    @property
    def blocks(self) -> Sequence[nn.Module]:
        return self.layers

    def context(self, layout: Layout) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Rotary tables per layer kind, for the batch's positions."""
        tables = {}
        for kind, inv_freq in self.inv_freq.items():
            freqs = layout.positions[:, None].float() * inv_freq.to(layout.positions.device)
            angles = torch.cat((freqs, freqs), dim=-1)[:, None, None, :]  # broadcast over q/k and heads
            tables[kind] = (angles.cos(), angles.sin())
        return tables

    def final(self, x: torch.Tensor) -> torch.Tensor:
        return self.final_norm(x)  # type: ignore[no-any-return]


class ModernBert(EncoderModel):
    """ModernBERT: `model.embeddings`, `model.layers.N`, `model.final_norm`; heads by name."""

    prefix = "model"
    ignored = ("head.", "decoder.")  # *ForMaskedLM's prediction head and decoder, unless a head takes them

    def build(self, config: Mapping[str, Any]) -> Backbone:
        return ModernBertBackbone(config)
