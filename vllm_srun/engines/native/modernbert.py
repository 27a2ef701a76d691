"""ModernBERT (and mmBERT, the same network with another vocabulary) over packed rows.

Pre-LayerNorm layers with rotary positions; every `global_attn_every_n_layers`-th layer (from
layer 0) attends over the whole row, the others within +-local_attention/2 tokens, each kind
with its own rope theta. GeGLU MLP. Biases follow the config's norm_bias, attention_bias,
mlp_bias and classifier_bias flags. Attribute names follow the checkpoint.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import torch
from torch import nn

from vllm_srun.engines.native.attention import Segments, packed_attention
from vllm_srun.engines.native.layers import EncoderModel, activation, first_tokens, mean_rows, num_labels
from vllm_srun.engines.native.weights import load_named
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


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding in float32 (as the reference does), returned in x's dtype."""
    xf = x.float()
    half = xf.shape[-1] // 2
    rotated = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)


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

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], segments: Segments
    ) -> torch.Tensor:
        qkv = self.Wqkv(x).view(x.shape[0], 3, self.heads, -1)
        # q and k rotate together (one op set for both), written back into the fresh qkv.
        qkv[:, :2] = _rotate(qkv[:, :2], *rope)
        return self.Wo(packed_attention(qkv, segments, window=self.window))


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
        # Layer 0's input is already the normalised embedding: it has no attn_norm.
        self.attn_norm = _layer_norm(config) if index else nn.Identity()
        window = int(config.get("local_attention", 128)) // 2 if kind == SLIDING else None
        self.attn = ModernBertAttention(config, window)
        self.mlp_norm = _layer_norm(config)
        self.mlp = ModernBertMLP(config)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], segments: Segments
    ) -> torch.Tensor:
        # Residuals added in place on each block's fresh output (addition commutes: same bits).
        x = self.attn(self.attn_norm(x), rope, segments).add_(x)
        return self.mlp(self.mlp_norm(x)).add_(x)


class ModernBertBackbone(nn.Module):
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

    def rope(self, positions: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        tables = {}
        for kind, inv_freq in self.inv_freq.items():
            freqs = positions[:, None].float() * inv_freq.to(positions.device)
            angles = torch.cat((freqs, freqs), dim=-1)[:, None, None, :]  # broadcast over q/k and heads
            tables[kind] = (angles.cos(), angles.sin())
        return tables

    def forward(self, input_ids: torch.Tensor, segments: Segments) -> torch.Tensor:
        x = self.embeddings(input_ids)
        rope = self.rope(segments.positions)
        for layer, kind in zip(self.layers, self.kinds, strict=True):
            x = layer(x, rope[kind], segments)
        return self.final_norm(x)


class ModernBertPredictionHead(nn.Module):
    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        hidden = config["hidden_size"]
        self.dense = nn.Linear(hidden, hidden, bias=config.get("classifier_bias", False))
        self.act = activation(config.get("classifier_activation", "gelu"))
        self.norm = _layer_norm(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(x)))


class _ModernBert(EncoderModel):
    prefix = "model."

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        self.model = ModernBertBackbone(config)

    def forward(
        self, input_ids: torch.Tensor, type_ids: torch.Tensor | None, segments: Segments
    ) -> torch.Tensor:
        return self.model(input_ids, segments)  # ModernBERT has no token types

    @property
    def num_layers(self) -> int:
        return len(self.model.layers)

    def hidden_at(
        self,
        input_ids: torch.Tensor,
        type_ids: torch.Tensor | None,
        segments: Segments,
        layers: Collection[int],
    ) -> dict[int, torch.Tensor]:
        """The hidden states after each encoder layer in `layers` (1-based), running no layer
        past the deepest asked for. As Transformers' `hidden_states[layer]`: an earlier layer's
        output is the residual stream before the final norm, the last layer's is the model's
        output (after it)."""
        backbone = self.model
        x = backbone.embeddings(input_ids)
        rope = backbone.rope(segments.positions)
        out: dict[int, torch.Tensor] = {}
        deepest = max(layers)
        for number, (layer, kind) in enumerate(zip(backbone.layers, backbone.kinds, strict=True), start=1):
            if number > deepest:
                break
            x = layer(x, rope[kind], segments)
            if number in layers:
                out[number] = backbone.final_norm(x) if number == len(backbone.layers) else x
        return out

    def load_weights(self, tensors: Mapping[str, torch.Tensor]) -> set[str]:
        return load_named(self, tensors, rename=self._rename)

    def _rename(self, name: str) -> str:
        # A bare ModernBertModel is saved without the "model." prefix.
        if name.startswith(("model.", "head.", "classifier.")):
            return name
        return "model." + name


class ModernBertModel(_ModernBert):
    """A bare encoder: hidden states and pooled views only."""


class _ModernBertClassifier(_ModernBert):
    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        self.head = ModernBertPredictionHead(config)
        # The reference gives the classifier a bias whatever classifier_bias says (that flag
        # is the head's dense layer).
        self.classifier = nn.Linear(config["hidden_size"], num_labels(config))
        self.pooling = config.get("classifier_pooling", "cls")
        if self.pooling not in ("cls", "mean"):
            raise ConfigError(f"classifier_pooling {self.pooling!r} is not supported ('cls' or 'mean')")


class ModernBertForSequenceClassification(_ModernBertClassifier):
    head_kind = "sequence"

    def sequence_logits(self, hidden: torch.Tensor, segments: Segments, rows: list[int]) -> torch.Tensor:
        pool = mean_rows if self.pooling == "mean" else first_tokens
        return self.classifier(self.head(pool(hidden, segments, rows).to(hidden.dtype)))


class ModernBertForTokenClassification(_ModernBertClassifier):
    head_kind = "token"

    def token_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.head(hidden))
