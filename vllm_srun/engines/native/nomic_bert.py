"""NomicBERT (nomic-embed-text) over packed rows, as Transformers' `NomicBertModel` computes it.

Words plus token types, normalised; rotary positions over the whole head (theta from
`rope_parameters`); post-LayerNorm layers without projection biases; a SwiGLU MLP whose
`fc11`/`fc12` fill one fused `fc1`. Other attribute names follow the checkpoint. The rotary
helpers here (`rope_theta`, `rotary_tables`) are GTE's too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from vllm_srun.engines.native.attention import Layout
from vllm_srun.engines.native.encoder import Backbone, EncoderModel
from vllm_srun.engines.native.layers import activation, rotate_
from vllm_srun.engines.native.weights import Stacked
from vllm_srun.errors import ConfigError

Rope = tuple[torch.Tensor, torch.Tensor]

# Settings of the original remote-code configs (and of Transformers' rope parameters) that
# change the network, with the one value implemented here. Present with another value: refused.
_FIXED = {
    "rotary_emb_fraction": 1.0,
    "rotary_emb_interleaved": False,
    "rotary_scaling_factor": None,
    "partial_rotary_factor": 1.0,
    "prenorm": False,
    "causal": False,
    "qkv_proj_bias": False,
    "mlp_fc1_bias": False,
    "mlp_fc2_bias": False,
    "moe_every_n_layers": 0,  # nomic-embed-text-v2-moe: mixture-of-experts MLPs
}


def refuse_unsupported(config: Mapping[str, Any], name: str, fixed: Mapping[str, Any]) -> None:
    """ConfigError naming the first setting in `fixed` that `config` sets to another value."""
    for key, value in fixed.items():
        if key in config and config[key] != value:
            raise ConfigError(f"{name} {key}={config[key]!r} is not supported (only {value!r})")


def rope_theta(config: Mapping[str, Any], name: str, default: float) -> float:
    """Rotary theta as Transformers reads it: `rope_parameters` (or the legacy `rope_scaling`
    and top-level `rope_theta`), the config class's default otherwise. Only the default rope
    type over the whole head is implemented; anything else is refused by name."""
    key = "rope_parameters" if config.get("rope_parameters") else "rope_scaling"
    params = config.get(key) or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise ConfigError(
            f"{name} {key} rope_type {rope_type!r} is not supported (only 'default': no rope scaling)"
        )
    refuse_unsupported(params, f"{name} {key}", {"partial_rotary_factor": 1.0})
    return float(params.get("rope_theta", config.get("rope_theta", default)))


def head_dim(config: Mapping[str, Any]) -> int:
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    if config.get("head_dim"):
        return int(config["head_dim"])
    if hidden % heads:
        raise ConfigError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
    return int(hidden // heads)


def inverse_frequencies(dim: int, theta: float) -> torch.Tensor:
    # A plain host tensor, not a buffer: modules are built on the meta device and this is not
    # in the checkpoint.
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device="cpu") / dim))


def rotary_tables(inv_freq: torch.Tensor, layout: Layout) -> Rope:
    """cos and sin [tokens, 1, 1, dim] of each token's position in its row, shaped to
    broadcast over a fused qkv's q/k pair and its heads (rotate-half layout: both halves of
    the head share each frequency)."""
    freqs = layout.positions[:, None].float() * inv_freq.to(layout.positions.device)
    angles = torch.cat((freqs, freqs), dim=-1)[:, None, None, :]
    return angles.cos(), angles.sin()


def attend_rotary(qkv: torch.Tensor, heads: int, rope: Rope, layout: Layout) -> torch.Tensor:
    """Attention of a fused [tokens, 3 * heads * dim] projection with q and k rotated."""
    qkv = qkv.view(qkv.shape[0], 3, heads, -1)
    rotate_(qkv[:, :2], *rope)  # q and k in one op set, in the fresh projection
    return layout.attend(qkv)


def swiglu(fused: torch.Tensor, act: Any) -> torch.Tensor:
    """`act(gate) * up` of a fused [tokens, 2 * inner] projection whose first half is up."""
    up, gate = fused.chunk(2, dim=-1)
    return act(gate) * up  # type: ignore[no-any-return]


class NomicBertEmbeddings(nn.Module):
    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        hidden = config["hidden_size"]
        self.word_embeddings = nn.Embedding(config["vocab_size"], hidden)
        self.token_type_embeddings = nn.Embedding(config.get("type_vocab_size", 2), hidden)

    def forward(self, input_ids: torch.Tensor, type_ids: torch.Tensor | None) -> torch.Tensor:
        x = self.word_embeddings(input_ids)
        # Without type ids every token is type 0: adding that one row equals the lookup.
        types = self.token_type_embeddings
        return x + (types.weight[0] if type_ids is None else types(type_ids))  # type: ignore[no-any-return]


class NomicBertAttention(nn.Module):
    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        self.heads = config["num_attention_heads"]
        width = self.heads * head_dim(config)
        self.Wqkv = nn.Linear(config["hidden_size"], 3 * width, bias=False)
        self.out_proj = nn.Linear(width, config["hidden_size"], bias=False)

    def forward(self, x: torch.Tensor, rope: Rope, layout: Layout) -> torch.Tensor:
        return self.out_proj(attend_rotary(self.Wqkv(x), self.heads, rope, layout))  # type: ignore[no-any-return]


class NomicBertMLP(nn.Module):
    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        hidden, inner = config["hidden_size"], config["intermediate_size"]
        self.fc1 = nn.Linear(hidden, 2 * inner, bias=False)  # fc11 (up) then fc12 (gate)
        self.fc2 = nn.Linear(inner, hidden, bias=False)
        self.act = activation(config.get("hidden_act", "silu"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(swiglu(self.fc1(x), self.act))  # type: ignore[no-any-return]


class NomicBertLayer(nn.Module):
    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        eps = config.get("layer_norm_eps", 1e-12)
        self.attn = NomicBertAttention(config)
        self.norm1 = nn.LayerNorm(config["hidden_size"], eps=eps)
        self.mlp = NomicBertMLP(config)
        self.norm2 = nn.LayerNorm(config["hidden_size"], eps=eps)

    def forward(self, x: torch.Tensor, layout: Layout, rope: Rope) -> torch.Tensor:
        # Residuals added in place on each block's fresh output (addition commutes: same bits).
        x = self.norm1(self.attn(x, rope, layout).add_(x))
        return self.norm2(self.mlp(x).add_(x))  # type: ignore[no-any-return]


class NomicBertEncoder(nn.Module):
    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(NomicBertLayer(config) for _ in range(config["num_hidden_layers"]))


class NomicBertBackbone(Backbone):
    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        refuse_unsupported(config, "NomicBERT", _FIXED)
        self.embeddings = NomicBertEmbeddings(config)
        self.emb_ln = nn.LayerNorm(config["hidden_size"], eps=config.get("layer_norm_eps", 1e-12))
        self.encoder = NomicBertEncoder(config)
        theta = rope_theta(config, "NomicBERT", 1000.0)
        # The remote-code configs' spelling of theta, which Transformers does not read: where it
        # disagrees with the theta Transformers uses, neither answer is safe.
        refuse_unsupported(config, "NomicBERT", {"rotary_emb_base": theta})
        self.inv_freq = inverse_frequencies(head_dim(config), theta)

    def embed(self, input_ids: torch.Tensor, type_ids: torch.Tensor | None, layout: Layout) -> torch.Tensor:
        return self.emb_ln(self.embeddings(input_ids, type_ids))  # type: ignore[no-any-return]

    @property
    def blocks(self) -> Sequence[nn.Module]:
        return self.encoder.layers

    def context(self, layout: Layout) -> Rope:
        return rotary_tables(self.inv_freq, layout)


class NomicBert(EncoderModel):
    """NomicBERT: `nomic_bert.embeddings`, `nomic_bert.emb_ln`, `nomic_bert.encoder.layers.N`;
    heads by name (pooler, token)."""

    prefix = "nomic_bert"
    stacked = (Stacked("mlp.fc11", "mlp.fc1", 0, 2), Stacked("mlp.fc12", "mlp.fc1", 1, 2))
    optional = ("pooler.",)
    ignored = ("cls.",)  # *ForMaskedLM's prediction head

    def build(self, config: Mapping[str, Any]) -> Backbone:
        return NomicBertBackbone(config)
