"""DistilBERT: word + absolute position embeddings (no token types), post-LayerNorm layers.

Attribute names follow the checkpoint (`distilbert.transformer.layer.0.attention.out_lin`,
`sa_layer_norm`, `ffn.lin1`, ...), except q_lin/k_lin/v_lin, which fill one fused `qkv`
projection as BERT's query/key/value do. Sizes come from DistilBERT's own config names (dim,
n_layers, n_heads, hidden_dim, activation); Transformers fixes every LayerNorm's eps at 1e-12.
Sinusoidal position tables (`sinusoidal_pos_embds`) are saved in the checkpoint like learned ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from vllm_srun.engines.native.attention import Layout
from vllm_srun.engines.native.encoder import Backbone, EncoderModel
from vllm_srun.engines.native.layers import activation
from vllm_srun.engines.native.packed import applies_activation
from vllm_srun.engines.native.weights import Stacked
from vllm_srun.errors import ConfigError

EPS = 1e-12
QKV = tuple(
    Stacked(f"attention.{part}", "attention.qkv", i, 3) for i, part in enumerate(("q_lin", "k_lin", "v_lin"))
)


def _sizes(config: Mapping[str, Any]) -> tuple[int, int, int]:
    """(dim, n_heads, hidden_dim), as DistilBertConfig names them."""
    return int(config["dim"]), int(config["n_heads"]), int(config["hidden_dim"])


class Embeddings(nn.Module):
    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        dim = _sizes(config)[0]
        self.word_embeddings = nn.Embedding(config["vocab_size"], dim)
        self.position_embeddings = nn.Embedding(config.get("max_position_embeddings", 512), dim)
        self.LayerNorm = nn.LayerNorm(dim, eps=EPS)

    def forward(self, input_ids: torch.Tensor, layout: Layout) -> torch.Tensor:
        return self.LayerNorm(self.word_embeddings(input_ids) + self.position_embeddings(layout.positions))  # type: ignore[no-any-return]


class DistilBertSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        if dim % heads:
            raise ConfigError(f"dim {dim} is not a multiple of n_heads {heads}")
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out_lin = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, layout: Layout) -> torch.Tensor:
        return self.out_lin(layout.attend(self.qkv(x).view(x.shape[0], 3, self.heads, -1)))  # type: ignore[no-any-return]


class FFN(nn.Module):
    # packed.fuse_activations may move the activation into `lin1` (oneDNN's post-op).
    activation_input = "lin1"

    def __init__(self, dim: int, hidden: int, act: str) -> None:
        super().__init__()
        self.lin1 = nn.Linear(dim, hidden)
        self.lin2 = nn.Linear(hidden, dim)
        self.activation_name = act
        self.act = activation(act, in_place=True)  # on lin1's output, which nothing else holds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.lin1(x)
        return self.lin2(out if applies_activation(self.lin1) else self.act(out))  # type: ignore[no-any-return]


class TransformerBlock(nn.Module):
    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        dim, heads, hidden = _sizes(config)
        self.attention = DistilBertSelfAttention(dim, heads)
        self.sa_layer_norm = nn.LayerNorm(dim, eps=EPS)
        self.ffn = FFN(dim, hidden, config.get("activation", "gelu"))
        self.output_layer_norm = nn.LayerNorm(dim, eps=EPS)

    def forward(self, x: torch.Tensor, layout: Layout, context: Any = None) -> torch.Tensor:
        # Residuals added in place on each block's fresh output (addition commutes: same bits).
        x = self.sa_layer_norm(self.attention(x, layout).add_(x))
        return self.output_layer_norm(self.ffn(x).add_(x))  # type: ignore[no-any-return]


class Transformer(nn.Module):
    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        self.layer = nn.ModuleList(TransformerBlock(config) for _ in range(int(config["n_layers"])))


class DistilBertBackbone(Backbone):
    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        self.embeddings = Embeddings(config)
        self.transformer = Transformer(config)

    def embed(self, input_ids: torch.Tensor, type_ids: torch.Tensor | None, layout: Layout) -> torch.Tensor:
        return self.embeddings(input_ids, layout)  # type: ignore[no-any-return]  # no token types

    @property
    def blocks(self) -> Sequence[nn.Module]:
        return self.transformer.layer  # type: ignore[return-value]


class DistilBert(EncoderModel):
    """`distilbert.embeddings`, `distilbert.transformer.layer.N`; heads by name (pre_classifier,
    token). DistilBertForMaskedLM's vocab_transform / vocab_layer_norm / vocab_projector are ignored."""

    prefix = "distilbert"
    stacked = QKV
    ignored = ("vocab_transform.", "vocab_layer_norm.", "vocab_projector.")

    def build(self, config: Mapping[str, Any]) -> Backbone:
        return DistilBertBackbone(config)
