"""ELECTRA: BERT's embeddings at `embedding_size`, projected to `hidden_size` by
`embeddings_project` where the two differ, then BERT's layers.

The checkpoint prefix is `electra`. The discriminator's sequence head is `classifier.dense` →
gelu → `classifier.out_proj` (the table's "dense_gelu" head); *ForPreTraining and *ForMaskedLM
load as bare encoders, their replaced-token and generator heads ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from vllm_srun.engines.native.attention import Layout
from vllm_srun.engines.native.bert import QKV, BertBackbone, BertEmbeddings
from vllm_srun.engines.native.encoder import Backbone, EncoderModel


class ElectraBackbone(BertBackbone):
    def __init__(self, config: Mapping[str, Any]) -> None:
        width = int(config.get("embedding_size") or config["hidden_size"])
        super().__init__(config, embeddings=BertEmbeddings(dict(config, hidden_size=width)))
        if width != config["hidden_size"]:
            # Named as the checkpoint names it; absent (as in Transformers) when the widths agree.
            self.embeddings_project = nn.Linear(width, config["hidden_size"])

    def embed(self, input_ids: torch.Tensor, type_ids: torch.Tensor | None, layout: Layout) -> torch.Tensor:
        x = super().embed(input_ids, type_ids, layout)
        project = getattr(self, "embeddings_project", None)
        return x if project is None else project(x)


class Electra(EncoderModel):
    """`electra.embeddings`, `electra.embeddings_project`, `electra.encoder.layer.N`."""

    prefix = "electra"
    stacked = QKV
    # ElectraForPreTraining's discriminator head; ElectraForMaskedLM's generator head.
    ignored = ("discriminator_predictions.", "generator_predictions.", "generator_lm_head.")

    def build(self, config: Mapping[str, Any]) -> Backbone:
        return ElectraBackbone(config)
