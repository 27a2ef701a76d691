"""RoBERTa, XLM-RoBERTa and CamemBERT (one network, three vocabularies): BERT's layers with
positions counted from `pad_token_id + 1`.

Transformers numbers a row's tokens from `padding_idx + 1` (the positions below it belong to
padding), so position `i` of a packed row reads row `i + pad_token_id + 1` of the table. The
checkpoint prefix is `roberta` for all three; their sequence head is `classifier.dense` →
tanh → `classifier.out_proj` (the table's "dense" head), and type ids are not read (their
checkpoints have one type).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from vllm_srun.engines.native.attention import Layout
from vllm_srun.engines.native.bert import QKV, BertBackbone, BertEmbeddings
from vllm_srun.engines.native.encoder import Backbone, EncoderModel


def roberta_positions(input_ids: torch.Tensor, positions: torch.Tensor, pad: int) -> torch.Tensor:
    """Position ids as Transformers' `create_position_ids_from_input_ids` gives them: a row's
    tokens count from `pad + 1`, and a `pad` token inside a row (a text may spell it) sits at
    `pad` without advancing the count. `positions` restart at 0 in each row (packed rows or a
    padded block), so `index - positions` is each token's row start."""
    real = (input_ids != pad).long()
    count = real.cumsum(0)
    start = torch.arange(input_ids.shape[0], device=input_ids.device) - positions
    before = count[start] - real[start]  # real tokens of earlier rows
    return (count - before) * real + pad


class RobertaEmbeddings(BertEmbeddings):
    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        self.pad = int(config.get("pad_token_id") or 0)

    def forward(self, input_ids: torch.Tensor, type_ids: torch.Tensor | None, layout: Layout) -> torch.Tensor:
        x = self.word_embeddings(input_ids) + self.token_type_embeddings.weight[0]  # one token type
        x = x + self.position_embeddings(roberta_positions(input_ids, layout.positions, self.pad))
        return self.LayerNorm(x)  # type: ignore[no-any-return]


class Roberta(EncoderModel):
    """`roberta.embeddings`, `roberta.encoder.layer.N`; *ForMaskedLM's `lm_head.` is ignored."""

    prefix = "roberta"
    stacked = QKV
    optional = ("pooler.",)
    ignored = ("lm_head.",)

    def build(self, config: Mapping[str, Any]) -> Backbone:
        return BertBackbone(config, embeddings=RobertaEmbeddings(config))
