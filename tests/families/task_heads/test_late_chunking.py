"""Late chunking's plan and finish without an engine: the document's one work item, its chunk
spans (a prompt in front belongs to none), its cache key apart from plain requests', and an
item error answering every chunk. Parity with Transformers is over HTTP (tests/app)."""

from __future__ import annotations

import itertools

import numpy as np
from families.task_heads.harness import Harness

from vllm_srun.families.task_heads import heads
from vllm_srun.plugins.base import ItemError
from vllm_srun.plugins.surfaces import EmbeddingsRequest

CHUNKS = ["john smith lives in paris", "and works at google", "in new york city"]


def test_one_item_holds_the_chunks_between_the_special_tokens(th: Harness) -> None:
    model = th.load("bert-embedding", None)
    tokenizer = model.encoder.tokenizer
    plan = model.plan_surface(
        "embeddings", EmbeddingsRequest(input=CHUNKS, prompt="query: ", late_chunking=True)
    )
    (item,) = plan.items
    prompt = tokenizer.encode("query: ", add_special_tokens=False).ids
    ids = [tokenizer.encode(c, add_special_tokens=False).ids for c in CHUNKS]
    cls, sep = tokenizer.encode("", add_special_tokens=True).ids
    assert item.token_ids == [cls, *prompt, *(i for one in ids for i in one), sep]
    starts = np.cumsum([1 + len(prompt)] + [len(i) for i in ids]).tolist()
    assert plan.state.chunks == list(itertools.pairwise(starts))
    plain = model.plan_surface("embeddings", EmbeddingsRequest(input=[item.token_ids]))
    assert plain.items[0].token_ids == item.token_ids and plain.items[0].key_extra != item.key_extra


def test_finish_pools_each_span_and_fans_an_error_out(th: Harness) -> None:
    model = th.load("bert-embedding", None)
    request = EmbeddingsRequest(input=CHUNKS, late_chunking=True, dimensions=8)
    plan = model.plan_surface("embeddings", request)
    states = np.random.default_rng(0).standard_normal((len(plan.items[0].token_ids), model.hidden_size))
    body = model.finish_surface(plan, [states.astype(np.float32)])
    for (start, end), data in zip(plan.state.chunks, body.data, strict=True):
        want = heads.pooled([states[start:end].mean(axis=0)], normalize=model.normalize, dimensions=8)
        np.testing.assert_allclose(data.embedding, want, atol=1e-6)
        assert data.input.tokens == end - start
    failed = model.finish_surface(plan, [ItemError("unavailable", "gone")])
    assert [(d.error, d.embedding) for d in failed.data] == [("unavailable", None)] * len(CHUNKS)
