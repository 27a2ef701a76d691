"""sentence.py and the embeddings surface: a sentence-transformers package's limit, prompts,
pooling and modules, read from its files; OpenAI's input forms and its over-long contract.

Planning needs no torch: these run on the tensor-less fixture packages. Numbers against
sentence-transformers itself are in tests/compat/test_sentence_transformers.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from families.task_heads.harness import LONG, Harness

from vllm_srun.errors import InvalidRequest, PackageError
from vllm_srun.families.task_heads.heads import pool_tokens
from vllm_srun.families.task_heads.model import TaskHeadsModel
from vllm_srun.families.task_heads.sentence import Dense
from vllm_srun.plugins.bodies import UnsupportedOption
from vllm_srun.plugins.package import ModelPackage
from vllm_srun.plugins.surfaces import EmbeddingsRequest, Options
from vllm_srun.queue.planning import plan_with_keys
from vllm_srun.testing.task_heads_fixtures import add_sentence_transformers

PROMPTS = {"query": "query: ", "document": "passage: "}


def _copy(th: Harness, tmp_path: Path, variant: str = "bert-embedding") -> Path:
    return Path(shutil.copytree(th.plan_package(variant), tmp_path / variant))


def _model(th: Harness, path: Path) -> TaskHeadsModel:
    model: TaskHeadsModel = th.load_path(path, None, name="st")
    return model


def _ids(model: TaskHeadsModel, request: EmbeddingsRequest) -> list[list[int]]:
    return [item.token_ids for item in model.plan_surface("embeddings", request).items]


def _encode(model: TaskHeadsModel, text: str) -> list[int]:
    return [int(i) for i in model.encoder.encode([(text, None)])[0].ids]


def test_limit_similarity_and_files_come_from_the_package(th: Harness, tmp_path: Path) -> None:
    path = add_sentence_transformers(_copy(th, tmp_path), max_seq_length=32, similarity_fn_name="dot")
    model = _model(th, path)
    assert model.info.max_tokens == 32 and model.max_tokens == 32
    assert model.info.embedding is not None and model.info.embedding.similarity_fn_name == "dot"
    files = th.family.verify(ModelPackage(path)).files
    assert {"sentence_bert_config.json", "config_sentence_transformers.json"} <= set(files)


def test_prompts_by_name_input_type_raw_and_default(th: Harness, tmp_path: Path) -> None:
    path = add_sentence_transformers(_copy(th, tmp_path), prompts=PROMPTS, default_prompt_name="query")
    model = _model(th, path)
    text = "john lives in paris"
    query, passage = _encode(model, "query: " + text), _encode(model, "passage: " + text)
    assert _ids(model, EmbeddingsRequest(input=text)) == [query]  # default_prompt_name
    assert _ids(model, EmbeddingsRequest(input=text, prompt_name="document")) == [passage]
    assert _ids(model, EmbeddingsRequest(input=text, input_type="document")) == [passage]
    assert _ids(model, EmbeddingsRequest(input=text, prompt="passage: ")) == [passage]
    assert _ids(model, EmbeddingsRequest(input=text, prompt="")) == [_encode(model, text)]
    with pytest.raises(UnsupportedOption, match="'query', 'document'") as unknown:
        model.plan_surface("embeddings", EmbeddingsRequest(input=text, prompt_name="qa"))
    assert unknown.value.param == "prompt_name"
    with pytest.raises(InvalidRequest, match="one of prompt, prompt_name and input_type"):
        model.plan_surface("embeddings", EmbeddingsRequest(input=text, prompt="x", input_type="query"))


def test_input_type_without_such_prompt_is_refused(th: Harness) -> None:
    model = th.load("bert-embedding", None)
    with pytest.raises(UnsupportedOption, match="no prompt named 'query'; its prompts: none") as error:
        model.plan_surface("embeddings", EmbeddingsRequest(input="x", input_type="query"))
    assert error.value.param == "input_type"


def test_prompt_left_out_of_pooling_is_in_the_plan_and_the_key(th: Harness, tmp_path: Path) -> None:
    """include_prompt false: the engine returns token states and finish pools past the prompt,
    so the cached row (token states) is the same whatever the prompt length, and a prompted
    item never shares a key with a pooled one."""
    plain = _model(th, add_sentence_transformers(_copy(th, tmp_path / "a"), prompts=PROMPTS))
    excluding = _model(
        th, add_sentence_transformers(_copy(th, tmp_path / "b"), prompts=PROMPTS, include_prompt=False)
    )
    request = EmbeddingsRequest(input="john lives in paris", prompt_name="query")
    (pooled,) = plan_with_keys(plain, "embeddings", request).items
    plan = plan_with_keys(excluding, "embeddings", request)
    (hidden,) = plan.items
    assert pooled.token_ids == hidden.token_ids and pooled.output == "mean" and hidden.output == "hidden"
    assert pooled.cache_key != hidden.cache_key
    # [CLS] and the prompt's tokens, not its [SEP]: sentence-transformers' prompt length.
    assert plan.state.skip == len(_encode(excluding, "query: ")) - 1
    no_prompt = plan_with_keys(excluding, "embeddings", EmbeddingsRequest(input="john lives in paris"))
    assert no_prompt.items[0].output == "mean" and no_prompt.state.skip == 0


def test_pool_tokens_leaves_out_the_masked_positions() -> None:
    hidden = np.arange(12, dtype=np.float32).reshape(4, 3)
    keep = np.array([False, False, True, True])
    assert pool_tokens(hidden, keep, "mean").tolist() == [7.5, 8.5, 9.5]
    assert pool_tokens(hidden, keep, "cls").tolist() == [6.0, 7.0, 8.0]
    assert pool_tokens(hidden, keep, "last").tolist() == [9.0, 10.0, 11.0]
    assert pool_tokens(hidden, np.zeros(4, dtype=bool), "mean").tolist() == [0.0, 0.0, 0.0]


def test_do_lower_case_lowercases_before_tokenising(th: Harness, tmp_path: Path) -> None:
    model = _model(
        th, add_sentence_transformers(_copy(th, tmp_path, "modernbert-embedding"), do_lower_case=True)
    )
    cased = th.load("modernbert-embedding", None)
    assert _encode(cased, "Paris") != _encode(cased, "paris")  # the tokenizer itself keeps case
    assert _ids(model, EmbeddingsRequest(input="Paris")) == [_encode(cased, "paris")]


def test_dense_module_is_read_and_checked(th: Harness, tmp_path: Path) -> None:
    path = add_sentence_transformers(_copy(th, tmp_path), dense_features=7)
    model = _model(th, path)
    assert model.info.embedding is not None and model.info.embedding.dimension == 7
    assert model.hidden_size != 7 and model.normalize
    rows = model.post_pooling(np.ones(model.hidden_size, dtype=np.float32))
    # The modules run in float64: the final Normalize leaves a norm within float64 ulps of 1.
    assert rows.shape == (7,) and abs(float(np.linalg.norm(rows)) - 1.0) < 1e-9
    config = json.loads((path / "2_Dense" / "config.json").read_text())
    config["activation_function"] = "my.module.Activation"
    (path / "2_Dense" / "config.json").write_text(json.dumps(config))
    with pytest.raises(PackageError, match=r"activation 'my\.module\.Activation'"):
        _model(th, path)


def test_token_id_inputs_are_taken_as_given(th: Harness) -> None:
    model = th.load("bert-embedding", None)
    ids: list[Any] = _encode(model, "john lives in paris")[1:-1]  # no [CLS]/[SEP] are added
    assert _ids(model, EmbeddingsRequest(input=ids)) == [ids]
    assert _ids(model, EmbeddingsRequest(input=[ids, ids[:2]])) == [ids, ids[:2]]
    with pytest.raises(UnsupportedOption, match=r"input\[1\]: token id 99999") as error:
        model.plan_surface("embeddings", EmbeddingsRequest(input=[ids, [5, 99999]]))
    assert error.value.param == "input[1]"
    with pytest.raises(InvalidRequest, match="only ids"):
        EmbeddingsRequest(input=["text", 5]).inputs()
    with pytest.raises(InvalidRequest, match="token ids are taken as given"):
        model.plan_surface("embeddings", EmbeddingsRequest(input=[ids], prompt="query: "))


def test_overlong_input_is_a_400_unless_truncation_or_reject_is_asked(th: Harness) -> None:
    model = th.load("bert-embedding", None)
    with pytest.raises(
        InvalidRequest, match=r"input\[1\]: input has \d+ tokens; the model takes at most 128"
    ) as e:
        plan_with_keys(model, "embeddings", EmbeddingsRequest(input=["short", LONG]), default_overflow=None)
    assert e.value.param == "input[1]"
    with pytest.raises(InvalidRequest) as single:
        plan_with_keys(model, "embeddings", EmbeddingsRequest(input=LONG), default_overflow=None)
    assert single.value.param == "input"
    # An explicit reject answers the input in place (the upstream runtime's form) ...
    explicit = EmbeddingsRequest(input=["short", LONG], options=Options(overflow="reject"))
    plan = plan_with_keys(model, "embeddings", explicit, default_overflow=None)
    assert plan.state.inputs[1].split.error is not None and len(plan.items) == 1
    # ... and so do bulk jobs, which plan with reject as the default.
    assert len(plan_with_keys(model, "embeddings", EmbeddingsRequest(input=["short", LONG])).items) == 1
    # serve --auto-truncate: truncated, and the result says so.
    auto = plan_with_keys(model, "embeddings", EmbeddingsRequest(input=LONG), default_overflow="truncate")
    assert len(auto.items[0].token_ids) == 128 and auto.state.inputs[0].split.info.truncated
    # Token ids over the limit are held to it too.
    ids: list[Any] = [5] * 200
    with pytest.raises(InvalidRequest, match="200 tokens"):
        plan_with_keys(model, "embeddings", EmbeddingsRequest(input=ids), default_overflow=None)
    left = EmbeddingsRequest(
        input=list(range(5, 205)), options=Options(overflow="truncate", truncation_direction="left")
    )
    assert model.plan_surface("embeddings", left).items[0].token_ids == list(range(77, 205))


@pytest.mark.torch
def test_prompt_left_out_and_dense_on_each_engine(th: Harness, engine: str, tmp_path: Path) -> None:
    """Token states from each engine, pooled past the prompt, through Dense and Normalize,
    against Transformers' token states put through the same sentence-transformers steps."""
    path = Path(shutil.copytree(th.package("bert-embedding"), tmp_path / "full"))
    add_sentence_transformers(path, prompts=PROMPTS, include_prompt=False, dense_features=5)
    model = th.load_path(path, engine)
    texts: list[Any] = ["john lives in paris", "a"]
    request = EmbeddingsRequest(input=texts, prompt_name="query")
    plan = model.plan_surface("embeddings", request)
    got = th.roundtrip(model, "embeddings", request)
    skip = plan.state.skip
    hidden = th.reference(path, [item.token_ids for item in plan.items])
    for data, states in zip(got.data, hidden, strict=True):
        pooled = states[skip:].astype(np.float64).mean(axis=0)
        dense = model.post_pooling.steps[0]
        assert isinstance(dense, Dense)
        want = np.tanh(pooled @ dense.weight.T + dense.bias)
        want /= np.linalg.norm(want)
        assert data.embedding is not None and len(data.embedding) == 5
        assert np.allclose(data.embedding, want, atol=1e-5)
