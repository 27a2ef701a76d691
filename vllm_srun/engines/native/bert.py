"""BERT over packed rows: absolute positions restart at 0 in each row, post-LayerNorm layers.

Attribute names follow the checkpoint (`bert.encoder.layer.0.attention.output.dense`, ...) so
`load_weights` maps names one to one, except query/key/value, which fill one fused `qkv`
projection: one matmul instead of three. RoBERTa, ELECTRA and their kin reuse these layers
with their own embeddings (see roberta.py, electra.py).
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

QKV = tuple(Stacked(f"self.{part}", "self.qkv", i, 3) for i, part in enumerate(("query", "key", "value")))


class BertEmbeddings(nn.Module):
    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        hidden = config["hidden_size"]
        self.word_embeddings = nn.Embedding(config["vocab_size"], hidden)
        self.position_embeddings = nn.Embedding(config.get("max_position_embeddings", 512), hidden)
        self.token_type_embeddings = nn.Embedding(config.get("type_vocab_size", 2), hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=config.get("layer_norm_eps", 1e-12))

    def forward(self, input_ids: torch.Tensor, type_ids: torch.Tensor | None, layout: Layout) -> torch.Tensor:
        x = self.word_embeddings(input_ids)
        # Without type ids every token is type 0: adding that one row equals the lookup.
        x = x + (
            self.token_type_embeddings.weight[0] if type_ids is None else self.token_type_embeddings(type_ids)
        )
        x = x + self.position_embeddings(self.positions(layout))
        return self.LayerNorm(x)

    def positions(self, layout: Layout) -> torch.Tensor:
        """Absolute position ids: 0 at each row's first token (RoBERTa offsets them)."""
        return layout.positions


class BertSelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        if hidden % heads:
            raise ConfigError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)

    def forward(self, x: torch.Tensor, layout: Layout) -> torch.Tensor:
        return layout.attend(self.qkv(x).view(x.shape[0], 3, self.heads, -1))


def add_norm(norm: nn.LayerNorm, out: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """`norm(out + residual)`, in place on `out`, which the caller no longer holds.

    In bfloat16 the sum is kept float32 into the LayerNorm, whose output alone is rounded:
    rounded before it, a token whose sum sits on a large common offset loses what the
    normalisation keeps, and on a trained base-size model (all-mpnet-base-v2) that moved whole
    embeddings past the twin check's bound, on texts of either corpus only with both of a
    layer's LayerNorms so kept (bench/bf16_drift.py, docs/performance.md).
    """
    if out.dtype != torch.bfloat16:
        return norm(out.add_(residual))  # type: ignore[no-any-return]
    weight, bias = norm.weight.float(), norm.bias.float()
    summed = out.float().add_(residual)
    return nn.functional.layer_norm(summed, norm.normalized_shape, weight, bias, norm.eps).to(out.dtype)


class BertAddNorm(nn.Module):
    """`dense` then residual add then LayerNorm: BERT's SelfOutput and Output blocks."""

    def __init__(self, width: int, hidden: int, eps: float) -> None:
        super().__init__()
        self.dense = nn.Linear(width, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        # In place on the dense output, which nothing else holds: one [tokens, hidden] tensor
        # fewer per block, bitwise the same sum.
        return add_norm(self.LayerNorm, self.dense(x), residual)


class BertAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, eps: float) -> None:
        super().__init__()
        self.self = BertSelfAttention(hidden, heads)
        self.output = BertAddNorm(hidden, hidden, eps)

    def forward(self, x: torch.Tensor, layout: Layout, context: Any = None) -> torch.Tensor:
        return self.output(self.self(x, layout), x)


class BertIntermediate(nn.Module):
    # packed.fuse_activations may move the activation into `dense` (oneDNN's post-op).
    activation_input = "dense"

    def __init__(self, hidden: int, intermediate: int, act: str) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, intermediate)
        self.activation_name = act
        self.act = activation(act, in_place=True)  # on the dense output, which nothing else holds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.dense(x)
        return out if applies_activation(self.dense) else self.act(out)


class BertLayer(nn.Module):
    """Attention, then the intermediate and output blocks. A variant whose attention block is
    its own (MPNet's `attention.attn` and `attention.LayerNorm`) passes it as `attention`; it is
    called as `attention(x, layout, context)` with the batch's context."""

    def __init__(self, config: Mapping[str, Any], attention: nn.Module | None = None) -> None:
        super().__init__()
        hidden, eps = config["hidden_size"], config.get("layer_norm_eps", 1e-12)
        self.attention = attention or BertAttention(hidden, config["num_attention_heads"], eps)
        self.intermediate = BertIntermediate(
            hidden, config["intermediate_size"], config.get("hidden_act", "gelu")
        )
        self.output = BertAddNorm(config["intermediate_size"], hidden, eps)

    def forward(self, x: torch.Tensor, layout: Layout, context: Any = None) -> torch.Tensor:
        x = self.attention(x, layout, context)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config["num_hidden_layers"]))


class BertBackbone(Backbone):
    """Embeddings, then `encoder.layer`; variants pass their own embeddings module."""

    def __init__(self, config: Mapping[str, Any], embeddings: nn.Module | None = None) -> None:
        super().__init__()
        kind = config.get("position_embedding_type", "absolute")
        if kind != "absolute":
            raise ConfigError(f"position_embedding_type {kind!r} is not supported (only 'absolute')")
        self.embeddings = embeddings if embeddings is not None else BertEmbeddings(config)
        self.encoder = BertEncoder(config)

    def embed(self, input_ids: torch.Tensor, type_ids: torch.Tensor | None, layout: Layout) -> torch.Tensor:
        return self.embeddings(input_ids, type_ids, layout)  # type: ignore[no-any-return]

    @property
    def blocks(self) -> Sequence[nn.Module]:
        return self.encoder.layer


class Bert(EncoderModel):
    """BERT: `bert.embeddings`, `bert.encoder.layer.N`; heads by name (pooler, token)."""

    prefix = "bert"
    stacked = QKV
    optional = ("pooler.",)
    ignored = ("cls.",)  # the masked-LM / pre-training heads of *ForMaskedLM, *ForPreTraining

    def build(self, config: Mapping[str, Any]) -> Backbone:
        return BertBackbone(config)
