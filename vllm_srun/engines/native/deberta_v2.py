"""DeBERTa-v2 and DeBERTa-v3 (model_type "deberta-v2") over packed rows.

BERT-shaped post-LayerNorm layers with disentangled attention (He et al., §3.1): content-to-
position and position-to-content terms over a shared relative-position table, log-bucketed
(v3) and clamped, entering attention as a `PositionBias`. v2 adds absolute positions, v3 has
none and no token types; `embedding_size` below the hidden size goes through `embed_proj`.
Attribute names follow the checkpoint (`deberta.encoder.layer.N...`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from vllm_srun.engines.native.attention import Layout, Segments
from vllm_srun.engines.native.bert import BertAddNorm, BertIntermediate
from vllm_srun.engines.native.encoder import Backbone, EncoderModel
from vllm_srun.errors import ConfigError

RELATIVE_TERMS = ("c2p", "p2c")
_EPS = 1e-7  # DebertaV2Config's layer_norm_eps default


def _flag(value: Any) -> bool:
    return value if isinstance(value, bool) else str(value).lower() in ("true", "1")


@dataclass(frozen=True)
class RelativeSettings:
    """What config.json says about relative attention, with Transformers' defaults applied."""

    enabled: bool
    terms: tuple[str, ...]  # a subset of RELATIVE_TERMS
    buckets: int  # <= 0: no log buckets
    max_positions: int
    share_key: bool
    norm: bool  # rel_embeddings pass through encoder.LayerNorm

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> RelativeSettings:
        conv = int(config.get("conv_kernel_size", 0) or 0)
        if conv > 0:
            raise ConfigError(
                f"DeBERTa-v2 conv_kernel_size {conv} (the convolution after the first layer) is not "
                "supported natively; export the model to onnx/model.onnx to serve it"
            )
        raw = config.get("pos_att_type") or []
        terms = [t.strip() for t in raw.lower().split("|")] if isinstance(raw, str) else [str(t) for t in raw]
        unknown = sorted(set(terms) - set(RELATIVE_TERMS))
        if unknown:
            raise ConfigError(f"DeBERTa-v2 pos_att_type {unknown} is not supported (only c2p, p2c)")
        norms = [x.strip() for x in str(config.get("norm_rel_ebd", "none")).lower().split("|")]
        if set(norms) - {"none", "layer_norm"}:
            raise ConfigError(f"DeBERTa-v2 norm_rel_ebd {config.get('norm_rel_ebd')!r} is not supported")
        max_positions = int(config.get("max_relative_positions", -1))
        if max_positions < 1:
            max_positions = int(config.get("max_position_embeddings", 512))
        return cls(
            enabled=_flag(config.get("relative_attention", False)),
            terms=tuple(t for t in RELATIVE_TERMS if t in terms),
            buckets=int(config.get("position_buckets", -1)),
            max_positions=max_positions,
            share_key=_flag(config.get("share_att_key", False)),
            norm="layer_norm" in norms,
        )

    @property
    def span(self) -> int:
        """Half the relative table: distances index it at span + δ."""
        return self.buckets if self.buckets > 0 else self.max_positions

    @property
    def scale_factor(self) -> int:
        """1 + the relative terms the config names (counted even without relative attention,
        as the reference does)."""
        return 1 + len(self.terms)

    def distances(self, width: int, device: torch.device) -> torch.Tensor:
        """[width, width] long: the (bucketed) relative distance i - j of query i to key j."""
        idx = torch.arange(width, device=device)
        rel = idx[:, None] - idx[None, :]
        if self.buckets <= 0:
            return rel
        # Log buckets: distances within +-mid stay as they are; beyond, ceil of a log scale that
        # reaches mid + (mid - 1) at max_positions - 1. Computed in float32 as the reference does,
        # so the ceil lands on the same side at every distance.
        mid = self.buckets // 2
        magnitude = rel.abs()
        magnitude = torch.where(magnitude < mid, torch.full_like(magnitude, mid - 1), magnitude)
        base = torch.log(torch.tensor((self.max_positions - 1) / mid, dtype=torch.float32, device=device))
        logs = torch.ceil(torch.log(magnitude.float() / mid) / base * (mid - 1)) + mid
        return torch.where(magnitude <= mid, rel, (logs * torch.sign(rel)).long())


@dataclass
class RelativeContext:
    """Per batch: the rows of the (normalised) relative table the batch reaches, and the index
    into those rows of every (query, key) pair of its widest row."""

    table: torch.Tensor  # [table rows, hidden]
    index: torch.Tensor  # [width, width] long, into `table`


class DebertaV2Embeddings(nn.Module):
    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        hidden = int(config["hidden_size"])
        width = int(config.get("embedding_size") or hidden)
        self.word_embeddings = nn.Embedding(config["vocab_size"], width)
        self.position_biased_input = _flag(config.get("position_biased_input", True))
        self.position_embeddings = (
            nn.Embedding(config.get("max_position_embeddings", 512), width)
            if self.position_biased_input
            else None
        )
        types = int(config.get("type_vocab_size", 0) or 0)
        self.token_type_embeddings = nn.Embedding(types, width) if types > 0 else None
        self.embed_proj = nn.Linear(width, hidden, bias=False) if width != hidden else None
        self.LayerNorm = nn.LayerNorm(hidden, eps=config.get("layer_norm_eps", _EPS))

    def forward(self, input_ids: torch.Tensor, type_ids: torch.Tensor | None, layout: Layout) -> torch.Tensor:
        x = self.word_embeddings(input_ids)
        if self.position_embeddings is not None:
            x = x + self.position_embeddings(layout.positions)
        if self.token_type_embeddings is not None:
            # Without type ids every token is type 0: adding that one row equals the lookup.
            types = self.token_type_embeddings
            x = x + (types.weight[0] if type_ids is None else types(type_ids))
        if self.embed_proj is not None:
            x = self.embed_proj(x)
        return self.LayerNorm(x)


class DisentangledBias:
    """The c2p and p2c terms of one layer as a `PositionBias`, already multiplied by the
    softmax scale (attention adds it to q·kᵀ·scale)."""

    def __init__(
        self,
        keys: torch.Tensor | None,  # [heads, table rows, dim]: Kr, for c2p
        queries: torch.Tensor | None,  # [heads, table rows, dim]: Qr, for p2c
        index: torch.Tensor,
        scale: float,
    ) -> None:
        self.keys, self.queries, self.index, self.scale = keys, queries, index, scale

    def __call__(self, q: torch.Tensor, k: torch.Tensor, width: int) -> torch.Tensor:
        index = self.index[:width, :width]
        shape = (q.shape[0], q.shape[1], width, width)
        bias: torch.Tensor | None = None
        if self.keys is not None:
            # c2p[i, j] = q_i · Kr[δ(i, j)]
            scores = torch.matmul(q, self.keys.transpose(-1, -2))  # [rows, heads, width, table]
            bias = scores.gather(-1, index.expand(shape))
        if self.queries is not None:
            # p2c[i, j] = k_j · Qr[δ(i, j)] (δ is odd, so the reference's -δ(j, i) is δ(i, j)):
            # gathered per key j over the queries i, then laid out query-major.
            scores = torch.matmul(k, self.queries.transpose(-1, -2))  # [rows, heads, width(j), table]
            term = scores.gather(-1, index.t().expand(shape)).transpose(-1, -2)
            bias = term if bias is None else bias + term
        assert bias is not None
        return bias * self.scale


class DisentangledSelfAttention(nn.Module):
    def __init__(self, config: Mapping[str, Any], relative: RelativeSettings) -> None:
        super().__init__()
        hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        if hidden % heads:
            raise ConfigError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
        head_dim = int(config.get("attention_head_size") or hidden // heads)
        if head_dim * heads != hidden:
            raise ConfigError(
                f"DeBERTa-v2 attention_head_size {head_dim} x {heads} heads differs from hidden_size {hidden}"
            )
        self.heads, self.relative = heads, relative
        self.scale = 1.0 / math.sqrt(head_dim * relative.scale_factor)
        self.query_proj = nn.Linear(hidden, hidden)
        self.key_proj = nn.Linear(hidden, hidden)
        self.value_proj = nn.Linear(hidden, hidden)
        if relative.enabled and not relative.share_key:
            if "c2p" in relative.terms:
                self.pos_key_proj = nn.Linear(hidden, hidden)
            if "p2c" in relative.terms:
                self.pos_query_proj = nn.Linear(hidden, hidden)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape[0], self.heads, -1)

    def forward(self, x: torch.Tensor, layout: Layout, context: RelativeContext | None) -> torch.Tensor:
        q, k, v = (self._heads(proj(x)) for proj in (self.query_proj, self.key_proj, self.value_proj))
        bias = None
        if context is not None and self.relative.terms:
            shared = self.relative.share_key
            keys = queries = None
            if "c2p" in self.relative.terms:
                proj = self.key_proj if shared else self.pos_key_proj
                keys = self._heads(proj(context.table)).transpose(0, 1)
            if "p2c" in self.relative.terms:
                proj = self.query_proj if shared else self.pos_query_proj
                queries = self._heads(proj(context.table)).transpose(0, 1)
            bias = DisentangledBias(keys, queries, context.index, self.scale)
        return layout.attend(q, k, v, bias=bias, scale=self.scale)


class DebertaV2Attention(nn.Module):
    def __init__(self, config: Mapping[str, Any], relative: RelativeSettings) -> None:
        super().__init__()
        hidden = int(config["hidden_size"])
        self.self = DisentangledSelfAttention(config, relative)
        self.output = BertAddNorm(hidden, hidden, config.get("layer_norm_eps", _EPS))

    def forward(self, x: torch.Tensor, layout: Layout, context: RelativeContext | None) -> torch.Tensor:
        return self.output(self.self(x, layout, context), x)


class DebertaV2Layer(nn.Module):
    def __init__(self, config: Mapping[str, Any], relative: RelativeSettings) -> None:
        super().__init__()
        hidden, inner = int(config["hidden_size"]), int(config["intermediate_size"])
        self.attention = DebertaV2Attention(config, relative)
        self.intermediate = BertIntermediate(hidden, inner, config.get("hidden_act", "gelu"))
        self.output = BertAddNorm(inner, hidden, config.get("layer_norm_eps", _EPS))

    def forward(
        self, x: torch.Tensor, layout: Layout, context: RelativeContext | None = None
    ) -> torch.Tensor:
        x = self.attention(x, layout, context)
        return self.output(self.intermediate(x), x)


class DebertaV2Encoder(nn.Module):
    def __init__(self, config: Mapping[str, Any], relative: RelativeSettings) -> None:
        super().__init__()
        hidden = int(config["hidden_size"])
        self.layer = nn.ModuleList(
            DebertaV2Layer(config, relative) for _ in range(config["num_hidden_layers"])
        )
        if relative.enabled:
            self.rel_embeddings = nn.Embedding(2 * relative.span, hidden)
        if relative.norm:
            self.LayerNorm = nn.LayerNorm(hidden, eps=config.get("layer_norm_eps", _EPS))


class DebertaV2Backbone(Backbone):
    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        self.relative = RelativeSettings.of(config)
        self.embeddings = DebertaV2Embeddings(config)
        self.encoder = DebertaV2Encoder(config, self.relative)

    def embed(self, input_ids: torch.Tensor, type_ids: torch.Tensor | None, layout: Layout) -> torch.Tensor:
        return self.embeddings(input_ids, type_ids, layout)  # type: ignore[no-any-return]

    @property
    def blocks(self) -> Sequence[nn.Module]:
        return self.encoder.layer

    def context(self, layout: Layout) -> RelativeContext | None:
        """The relative table rows and their index for the batch's widest row."""
        relative = self.relative
        if not relative.enabled or not relative.terms:
            return None
        width = max(layout.lengths) if isinstance(layout, Segments) else layout.width
        device = layout.positions.device
        span = relative.span
        index = (relative.distances(width, device) + span).clamp_(0, 2 * span - 1)
        low, high = int(index.min()), int(index.max())
        table = self.encoder.rel_embeddings.weight[low : high + 1]
        if relative.norm:
            table = self.encoder.LayerNorm(table)  # row-wise: the same rows as normalising it all
        return RelativeContext(table=table, index=index - low)


class DebertaV2(EncoderModel):
    """DeBERTa-v2/v3: `deberta.embeddings`, `deberta.encoder.layer.N`, `deberta.encoder.rel_embeddings`;
    heads by name (context_pooler, token). *ForMaskedLM loads as a bare encoder."""

    prefix = "deberta"
    # The masked-LM heads: `cls.` (legacy), `lm_predictions.`, and the RTD `mask_predictions.`.
    ignored = ("cls.", "lm_predictions.", "mask_predictions.")

    def build(self, config: Mapping[str, Any]) -> Backbone:
        return DebertaV2Backbone(config)

    def _harmless(self, name: str) -> bool:
        # Checkpoints of models without absolute positions may still carry the table, which the
        # reference skips on load too (its _keys_to_ignore_on_load_unexpected).
        bare = name.removeprefix(f"{self.prefix}.")
        if (
            bare.startswith("embeddings.position_embeddings.")
            and self._rename(name) not in self._parameter_names()
        ):
            return True
        return super()._harmless(name)
