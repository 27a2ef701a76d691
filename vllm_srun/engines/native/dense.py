"""The small-batch path: a few rows padded into one [rows, width] block, BERT layers run on it.

The packed path pays per layer for regrouping rows (an index_select into padded groups and an
index_copy back) and per batch for building the groups; for one row or a few rows of similar
length those ops cost more than the padding they avoid. Here the block goes through every
layer as it is: one SDPA call per layer on a view of the fused QKV projection, with a
key-padding mask only when rows differ in length. The same modules and weights as the packed
path, so no second copy of anything; only float rounding inside SDPA and the matmuls differs
from the packed forward (the parity tests hold both to the Transformers reference).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from vllm_srun.engines.native.bert import BertBackbone, BertLayer


def dense_bert(
    backbone: BertBackbone,
    ids: torch.Tensor,
    types: torch.Tensor | None,
    mask: torch.Tensor | None,
    sdpa: Callable[..., torch.Tensor] = F.scaled_dot_product_attention,
) -> torch.Tensor:
    """Final hidden states [rows, width, hidden] of right-padded `ids` [rows, width].

    `mask` is the additive key mask [rows, 1, 1, width] (0 or -inf), None when no row is padded;
    `sdpa` is called as torch's scaled_dot_product_attention is (an accelerator's kernel).
    """
    rows, width = ids.shape
    emb = backbone.embeddings
    x = emb.word_embeddings(ids)
    x = x + (emb.token_type_embeddings.weight[0] if types is None else emb.token_type_embeddings(types))
    x = emb.LayerNorm(x + emb.position_embeddings.weight[:width])
    for module in backbone.encoder.layer:
        layer = cast("BertLayer", module)
        attention = layer.attention
        heads = attention.self.heads
        q, k, v = attention.self.qkv(x).view(rows, width, 3, heads, -1).permute(2, 0, 3, 1, 4)
        context = sdpa(q, k, v, attn_mask=mask)
        x = attention.output(context.transpose(1, 2).reshape(rows, width, -1), x)
        x = layer.output(layer.intermediate(x), x)
    return cast("torch.Tensor", x)
