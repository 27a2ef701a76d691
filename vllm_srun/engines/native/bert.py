"""BERT over packed rows: absolute positions restart at 0 in each row, post-LayerNorm layers.

Attribute names follow the checkpoint (`bert.encoder.layer.0.attention.output.dense`, ...) so
`load_weights` maps names one to one, except query/key/value, which fill one fused `qkv`
projection: one matmul instead of three.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, ClassVar

import torch
from torch import nn

from vllm_srun.engines.native.attention import Segments, packed_attention
from vllm_srun.engines.native.layers import EncoderModel, activation, first_tokens, num_labels
from vllm_srun.engines.native.weights import Stacked, load_named
from vllm_srun.errors import ConfigError

_QKV = tuple(Stacked(f"self.{part}", "self.qkv", i, 3) for i, part in enumerate(("query", "key", "value")))


class BertEmbeddings(nn.Module):
    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        hidden = config["hidden_size"]
        self.word_embeddings = nn.Embedding(config["vocab_size"], hidden)
        self.position_embeddings = nn.Embedding(config.get("max_position_embeddings", 512), hidden)
        self.token_type_embeddings = nn.Embedding(config.get("type_vocab_size", 2), hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=config.get("layer_norm_eps", 1e-12))

    def forward(
        self, input_ids: torch.Tensor, type_ids: torch.Tensor | None, segments: Segments
    ) -> torch.Tensor:
        x = self.word_embeddings(input_ids)
        # Without type ids every token is type 0: adding that one row equals the lookup.
        x = x + (
            self.token_type_embeddings.weight[0] if type_ids is None else self.token_type_embeddings(type_ids)
        )
        x = x + self.position_embeddings(segments.positions)
        return self.LayerNorm(x)


class BertSelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        if hidden % heads:
            raise ConfigError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)

    def forward(self, x: torch.Tensor, segments: Segments) -> torch.Tensor:
        return packed_attention(self.qkv(x).view(x.shape[0], 3, self.heads, -1), segments)


class BertAddNorm(nn.Module):
    """`dense` then residual add then LayerNorm: BERT's SelfOutput and Output blocks."""

    def __init__(self, width: int, hidden: int, eps: float) -> None:
        super().__init__()
        self.dense = nn.Linear(width, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        # In place on the dense output, which nothing else holds: one [tokens, hidden] tensor
        # fewer per block, bitwise the same sum.
        return self.LayerNorm(self.dense(x).add_(residual))


class BertAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, eps: float) -> None:
        super().__init__()
        self.self = BertSelfAttention(hidden, heads)
        self.output = BertAddNorm(hidden, hidden, eps)

    def forward(self, x: torch.Tensor, segments: Segments) -> torch.Tensor:
        return self.output(self.self(x, segments), x)


class BertIntermediate(nn.Module):
    def __init__(self, hidden: int, intermediate: int, act: str) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, intermediate)
        self.act = activation(act, in_place=True)  # on the dense output, which nothing else holds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        hidden, eps = config["hidden_size"], config.get("layer_norm_eps", 1e-12)
        self.attention = BertAttention(hidden, config["num_attention_heads"], eps)
        self.intermediate = BertIntermediate(
            hidden, config["intermediate_size"], config.get("hidden_act", "gelu")
        )
        self.output = BertAddNorm(config["intermediate_size"], hidden, eps)

    def forward(self, x: torch.Tensor, segments: Segments) -> torch.Tensor:
        x = self.attention(x, segments)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config["num_hidden_layers"]))

    def forward(self, x: torch.Tensor, segments: Segments) -> torch.Tensor:
        for layer in self.layer:
            x = layer(x, segments)
        return x


class BertPooler(nn.Module):
    """Dense + tanh on the first ([CLS]) token, as BERT's sequence classifiers expect."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)

    def forward(self, cls: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(cls))


class BertBackbone(nn.Module):
    def __init__(self, config: Mapping[str, Any], *, pooler: bool) -> None:
        super().__init__()
        kind = config.get("position_embedding_type", "absolute")
        if kind != "absolute":
            raise ConfigError(f"BERT position_embedding_type {kind!r} is not supported (only 'absolute')")
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config["hidden_size"]) if pooler else None

    def forward(
        self, input_ids: torch.Tensor, type_ids: torch.Tensor | None, segments: Segments
    ) -> torch.Tensor:
        return self.encoder(self.embeddings(input_ids, type_ids, segments), segments)


class _Bert(EncoderModel):
    uses_pooler: ClassVar[bool] = False

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        self.bert = BertBackbone(config, pooler=self.uses_pooler)

    def forward(
        self, input_ids: torch.Tensor, type_ids: torch.Tensor | None, segments: Segments
    ) -> torch.Tensor:
        return self.bert(input_ids, type_ids, segments)

    @property
    def num_layers(self) -> int:
        return len(self.bert.encoder.layer)

    def hidden_at(
        self,
        input_ids: torch.Tensor,
        type_ids: torch.Tensor | None,
        segments: Segments,
        layers: Collection[int],
    ) -> dict[int, torch.Tensor]:
        """The hidden states after each encoder layer in `layers` (1-based), running no layer
        past the deepest asked for: Transformers' `hidden_states[layer]`."""
        x = self.bert.embeddings(input_ids, type_ids, segments)
        out: dict[int, torch.Tensor] = {}
        for number, layer in enumerate(self.bert.encoder.layer[: max(layers)], start=1):
            x = layer(x, segments)
            if number in layers:
                out[number] = x  # each layer returns a fresh tensor: later layers leave it as is
        return out

    def load_weights(self, tensors: Mapping[str, torch.Tensor]) -> set[str]:
        return load_named(self, tensors, rename=self._rename, stacked=_QKV, harmless=self._harmless)

    def _rename(self, name: str) -> str:
        # Old TF-converted checkpoints spell LayerNorm parameters gamma/beta.
        name = name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        # A bare BertModel (sentence-transformers) is saved without the "bert." prefix.
        if name.startswith("classifier.") or name.startswith("bert."):
            return name
        return "bert." + name

    def _harmless(self, name: str) -> bool:
        bare = name.removeprefix("bert.")
        # position_ids/token_type_ids are index buffers older transformers saved; positions are
        # computed here. Heads without the pooler ignore pooler weights a checkpoint may carry.
        if bare in ("embeddings.position_ids", "embeddings.token_type_ids"):
            return True
        return not self.uses_pooler and bare.startswith("pooler.")


class BertModel(_Bert):
    """A bare encoder: hidden states and pooled views only."""


class BertForSequenceClassification(_Bert):
    head_kind = "sequence"
    uses_pooler = True

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        self.classifier = nn.Linear(config["hidden_size"], num_labels(config))

    def sequence_logits(self, hidden: torch.Tensor, segments: Segments, rows: list[int]) -> torch.Tensor:
        assert self.bert.pooler is not None
        return self.classifier(self.bert.pooler(first_tokens(hidden, segments, rows)))


class BertForTokenClassification(_Bert):
    head_kind = "token"

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        self.classifier = nn.Linear(config["hidden_size"], num_labels(config))

    def token_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.classifier(hidden)
