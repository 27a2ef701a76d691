"""MPNet over packed rows: post-LayerNorm layers with a shared relative-position bias.

As Transformers' `modeling_mpnet.py` computes it: positions start after padding index 1, and
every layer adds one learned bias (`encoder.relative_attention_bias`) by T5-style
bidirectional log buckets of each row's own distances. Query/key/value fill one fused
`attn.qkv` projection; every other name follows the checkpoint.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from vllm_srun.engines.native.attention import Layout
from vllm_srun.engines.native.bert import BertLayer, add_norm
from vllm_srun.engines.native.encoder import Backbone, EncoderModel
from vllm_srun.engines.native.weights import Stacked
from vllm_srun.errors import ConfigError

# Transformers' MPNetEmbeddings hard-codes padding_idx = 1: positions are 2, 3, ... and a token
# with id 1 takes position 1 without advancing the count.
PADDING_IDX = 1
# MPNetEncoder.compute_position_bias buckets into 32 and relative_position_bucket caps at 128,
# both as defaults it never overrides from the config.
NUM_BUCKETS = 32
MAX_DISTANCE = 128

QKV = tuple(Stacked(f"attn.{part}", "attn.qkv", i, 3) for i, part in enumerate("qkv"))


def relative_buckets(width: int, device: torch.device) -> torch.Tensor:
    """[width, width] bucket of key j for query i (bidirectional: half the buckets per side,
    exact below a quarter of them, logarithmic up to MAX_DISTANCE, then the last bucket)."""
    idx = torch.arange(width, device=device)
    n = idx[:, None] - idx[None, :]  # query minus key: the reference's -(memory - context)
    half = NUM_BUCKETS // 2
    exact = half // 2
    side = (n < 0).long() * half
    n = n.abs()
    # In float32 and truncated, exactly as the reference, so every bucket boundary agrees.
    scaled = torch.log(n.float() / exact) / math.log(MAX_DISTANCE / exact) * (half - exact)
    large = (exact + scaled.long()).clamp(max=half - 1)
    return side + torch.where(n < exact, n, large)


class RelativeBias:
    """The shared bias of one batch, as a `PositionBias`: [1, heads, width, width] from the
    width alone, built once per padded width and reused by every layer."""

    def __init__(self, table: nn.Embedding) -> None:
        self.table = table
        self.by_width: dict[int, torch.Tensor] = {}

    def __call__(self, q: torch.Tensor, k: torch.Tensor, width: int) -> torch.Tensor:
        bias = self.by_width.get(width)
        if bias is None:
            bias = self.table(relative_buckets(width, q.device)).permute(2, 0, 1).unsqueeze(0).to(q.dtype)
            self.by_width[width] = bias
        return bias


def mpnet_positions(input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Position ids as the reference derives them from the ids of a row: PADDING_IDX + 1 + the
    number of earlier tokens whose id is not PADDING_IDX; PADDING_IDX for such a token itself.

    `positions` restart at 0 in each row (packed or in a padded block), so `index - positions`
    is each token's row start; a running count of id-1 tokens, less its value before the row
    start, is the count within the row."""
    pad = input_ids.eq(PADDING_IDX)
    seen = pad.long().cumsum(0)
    start = torch.arange(input_ids.shape[0], device=input_ids.device) - positions
    in_row = seen - (seen[start] - pad[start].long())
    return torch.where(pad, PADDING_IDX, positions - in_row + PADDING_IDX + 1)


class MPNetEmbeddings(nn.Module):
    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        hidden = config["hidden_size"]
        self.word_embeddings = nn.Embedding(config["vocab_size"], hidden)
        self.position_embeddings = nn.Embedding(config.get("max_position_embeddings", 514), hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=config.get("layer_norm_eps", 1e-12))

    def forward(self, input_ids: torch.Tensor, layout: Layout) -> torch.Tensor:
        x = self.word_embeddings(input_ids) + self.position_embeddings(
            mpnet_positions(input_ids, layout.positions)
        )
        return self.LayerNorm(x)


class MPNetSelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        if hidden % heads:
            raise ConfigError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.o = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, layout: Layout, bias: RelativeBias) -> torch.Tensor:
        return self.o(layout.attend(self.qkv(x).view(x.shape[0], 3, self.heads, -1), bias=bias))  # type: ignore[no-any-return]


class MPNetAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, eps: float) -> None:
        super().__init__()
        self.attn = MPNetSelfAttention(hidden, heads)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor, layout: Layout, bias: RelativeBias) -> torch.Tensor:
        return add_norm(self.LayerNorm, self.attn(x, layout, bias), x)


class MPNetEncoder(nn.Module):
    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        hidden, heads = config["hidden_size"], config["num_attention_heads"]
        eps = config.get("layer_norm_eps", 1e-12)
        self.layer = nn.ModuleList(
            BertLayer(config, attention=MPNetAttention(hidden, heads, eps))
            for _ in range(config["num_hidden_layers"])
        )
        buckets = int(config.get("relative_attention_num_buckets", NUM_BUCKETS))
        if buckets < NUM_BUCKETS:
            raise ConfigError(
                f"relative_attention_num_buckets {buckets} is below the {NUM_BUCKETS} buckets MPNet looks up"
            )
        self.relative_attention_bias = nn.Embedding(buckets, config["num_attention_heads"])


class MPNetBackbone(Backbone):
    """`embeddings` (word + position, no token types), `encoder.layer` and the encoder's
    shared `relative_attention_bias`, passed to every layer as the batch's context."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        self.embeddings = MPNetEmbeddings(config)
        self.encoder = MPNetEncoder(config)

    def embed(self, input_ids: torch.Tensor, type_ids: torch.Tensor | None, layout: Layout) -> torch.Tensor:
        return self.embeddings(input_ids, layout)  # type: ignore[no-any-return]

    @property
    def blocks(self) -> Sequence[nn.Module]:
        return self.encoder.layer

    def context(self, layout: Layout) -> RelativeBias:
        return RelativeBias(self.encoder.relative_attention_bias)


class MPNet(EncoderModel):
    """MPNet: `mpnet.embeddings`, `mpnet.encoder.layer.N`, `mpnet.encoder.relative_attention_bias`;
    heads by name (dense, token). A bare model's `pooler` and a masked LM's `lm_head` are
    dropped: no surface runs them."""

    prefix = "mpnet"
    stacked = QKV
    optional = ("pooler.",)
    ignored = ("lm_head.",)

    def build(self, config: Mapping[str, Any]) -> Backbone:
        return MPNetBackbone(config)
