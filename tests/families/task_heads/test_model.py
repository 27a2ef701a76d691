"""model.py: requests a model refuses, and the cache keys of the work items it plans."""

from __future__ import annotations

import pytest
from families.task_heads.harness import Harness

from vllm_srun.errors import InvalidRequest, UnsupportedSurface
from vllm_srun.plugins.bodies import UnsupportedOption
from vllm_srun.plugins.surfaces import (
    ClassifyRequest,
    EmbeddingsRequest,
    Options,
    RerankRequest,
    TextPair,
)


def test_invalid_requests(th: Harness) -> None:
    sequence = th.load("bert-sequence", None)
    with pytest.raises(UnsupportedOption, match=r"options\.head: no head 'x'; heads: sequence"):
        sequence.plan_surface("classify", ClassifyRequest(input="a", options=Options(head="x")))
    with pytest.raises(UnsupportedSurface):
        sequence.plan_surface("embeddings", EmbeddingsRequest(input="a"))
    with pytest.raises(UnsupportedSurface):
        sequence.plan_surface("rerank", RerankRequest(query="a", documents=["b"]))
    two = th.load("modernbert-sequence", None)
    with pytest.raises(UnsupportedOption, match=r"options\.head: head 'sequence' does not answer rerank"):
        two.plan_surface(
            "rerank", RerankRequest(query="a", documents=["b"], options=Options(head="sequence"))
        )
    token = th.load("bert-token", None)
    with pytest.raises(UnsupportedOption, match=r"input\[1\].text_pair"):
        token.plan_surface("classify", ClassifyRequest(input=["a", TextPair(text="a", text_pair="b")]))
    with pytest.raises(InvalidRequest, match="input"):
        sequence.plan_surface("classify", ClassifyRequest(input=[]))


def test_cache_keys_see_output_kind_and_token_types(th: Harness) -> None:
    model = th.load("bert-sequence", None)
    single = model.plan_surface("classify", ClassifyRequest(input="a [SEP] b")).items[0]
    pair = model.plan_surface("classify", ClassifyRequest(input=TextPair(text="a", text_pair="b"))).items[0]
    assert single.token_ids == pair.token_ids  # a literal [SEP] tokenizes like the pair separator
    assert single.type_ids is None and pair.type_ids == [0, 0, 0, 1, 1]
    assert single.key_extra != pair.key_extra
    assert single.output == "logits" and "logits" in single.key_extra
    modern = th.load("modernbert-sequence", None)
    item = modern.plan_surface("classify", ClassifyRequest(input=TextPair(text="a", text_pair="b"))).items[0]
    assert item.type_ids is None
