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


class RobertaEmbeddings(BertEmbeddings):
    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        self.offset = int(config.get("pad_token_id") or 0) + 1

    def positions(self, layout: Layout) -> torch.Tensor:
        return layout.positions + self.offset


class Roberta(EncoderModel):
    """`roberta.embeddings`, `roberta.encoder.layer.N`; *ForMaskedLM's `lm_head.` is ignored."""

    prefix = "roberta"
    stacked = QKV
    optional = ("pooler.",)
    ignored = ("lm_head.",)

    def build(self, config: Mapping[str, Any]) -> Backbone:
        return BertBackbone(config, embeddings=RobertaEmbeddings(config))
