"""The nli_decisions family on tiny random NLI packages with real tokenizers.

Questions are planned, run through the native engine in one batch, and finished, the way the
server does it; the engine's logits are checked against Transformers, and every answer
against the documented readout (entailment minus contradiction, softmax / sigmoid).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from vllm_srun.families.nli_decisions import NliDecisionsFamily, templates
from vllm_srun.families.nli_decisions.model import NliDecisionModel
from vllm_srun.plugins.base import Device
from vllm_srun.plugins.decision_bodies import DecisionRequest, parse_question
from vllm_srun.plugins.package import ModelPackage, combined_sha256, sha256_file
from vllm_srun.plugins.vectors import sigmoid, softmax
from vllm_srun.queue import keys

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None,
    reason="the fixture writer needs torch and transformers",
)

VARIANTS = ("bert", "modernbert", "deberta-v3")
CHOICE = {
    "type": "choice",
    "instructions": "Which domain is the request about?",
    "choices": [
        {"key": "math", "description": "mathematics"},
        {"key": "code", "description": "programming"},
        {"key": "other", "description": "something else"},
    ],
}
NOUL = {"type": "noul", "instructions": "Does the request need several steps?"}
NOUL_BOTH = {**NOUL, "criteria": {"true": "it needs several steps", "false": "one step is enough"}}
SCORE = {"type": "score", "instructions": "How hard is it?", "levels": ["easy", "fair", "hard", "very hard"]}


def _native() -> Any:
    try:
        from vllm_srun.engines.native import NativeEngine
    except ImportError as exc:  # the native engine is written alongside this family
        pytest.skip(f"the native engine does not import yet: {exc}")
    return NativeEngine()


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from vllm_srun.testing.nli_fixtures import write_fixture

    root = tmp_path_factory.mktemp("nli")
    return {v: write_fixture(root / v, variant=v) for v in VARIANTS}


def load(path: Path, *, engine: bool = True) -> NliDecisionModel:
    family = NliDecisionsFamily()
    package = ModelPackage(path)
    assert family.detect(package)
    verification, spec = family.verify(package), family.describe(package)
    engine_model = None
    if engine:
        native = _native()
        reason = native.supports(spec, Device("cpu"))
        if reason is not None:
            pytest.skip(f"native engine cannot run {spec.architecture}: {reason}")
        engine_model = native.load(spec, Device("cpu"), "float32", native.read(spec, "float32"))
    return family.load(
        package, spec, engine_model, name=path.name, verification=verification, numerics="float32"
    )


def serve(model: NliDecisionModel, body: dict[str, Any]) -> tuple[dict[str, Any], Any, list[np.ndarray]]:
    plan = model.plan_surface("decisions", msgspec.convert(body, DecisionRequest))
    results = model.run(plan.items) if plan.items else []
    return msgspec.to_builtins(model.finish_surface(plan, results)), plan, results


def test_detect_needs_entailment_and_contradiction(tmp_path: Path, packages: dict[str, Path]) -> None:
    family = NliDecisionsFamily()
    for path in packages.values():
        assert family.detect(ModelPackage(path))
    config = json.loads((packages["bert"] / "config.json").read_text())
    other = tmp_path / "sentiment"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({**config, "id2label": {"0": "negative", "1": "positive"}}))
    assert not family.detect(ModelPackage(other))
    (other / "config.json").write_text(json.dumps({**config, "architectures": ["BertModel"]}))
    assert not family.detect(ModelPackage(other))
    (other / "config.json").write_text(json.dumps({**config, "model_type": "deberta-v2"}))
    assert not family.detect(ModelPackage(other))


def test_verify_hashes_every_loaded_file(tmp_path: Path, packages: dict[str, Path]) -> None:
    family = NliDecisionsFamily()
    path = shutil.copytree(packages["bert"], tmp_path / "copy")
    verification = family.verify(ModelPackage(path))
    assert set(verification.files) == {
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "model.safetensors",
    }
    assert verification.files["model.safetensors"] == sha256_file(path / "model.safetensors")
    assert verification.model_sha256 == combined_sha256(dict(verification.files))
    assert verification.max_tokens == 128
    (path / "tokenizer_config.json").write_text('{"model_max_length": 64}')
    changed = family.verify(ModelPackage(path))
    assert changed.model_sha256 != verification.model_sha256 and changed.max_tokens == 64


def test_templates_are_documented_hypotheses() -> None:
    choice = parse_question("c", CHOICE, "questions.c")
    assert templates.hypotheses(choice)[0] == "Which domain is the request about? Answer: mathematics."
    assert templates.hypotheses(parse_question("n", NOUL, "q")) == [
        "Does the request need several steps? Answer: yes."
    ]
    both = templates.hypotheses(parse_question("n", NOUL_BOTH, "q"))
    assert both[1] == "Does the request need several steps? Answer: one step is enough."
    ends = parse_question("e", {**NOUL, "criteria": {"true": "Really?"}}, "q")
    assert templates.hypotheses(ends) == ["Does the request need several steps? Answer: Really?"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_pairs_are_cacheable_work_items(packages: dict[str, Path], variant: str) -> None:
    model = load(packages[variant], engine=False)
    body = {"state": "what is 2 + 2", "questions": {"c": CHOICE, "n": NOUL_BOTH, "s": SCORE}}
    first = model.plan_surface("decisions", msgspec.convert(body, DecisionRequest))
    again = model.plan_surface("decisions", msgspec.convert(body, DecisionRequest))
    assert len(first.items) == 3 + 2 + 4
    for item in first.items:
        assert item.output == "logits" and item.key_extra == "nli"
        assert (item.type_ids is not None) == (variant == "bert")
    if variant == "bert":
        assert set(first.items[0].type_ids or []) == {0, 1}

    def key(item: Any) -> str:
        return keys.cache_key(
            model_sha256=model.info.model_sha256,
            numerics="float32",
            key_extra=item.key_extra,
            token_ids=item.token_ids,
            type_ids=item.type_ids,
        )

    assert [key(i) for i in first.items] == [key(i) for i in again.items]
    assert len({key(i) for i in first.items}) == len(first.items)


@pytest.mark.parametrize("variant", VARIANTS)
def test_answers_follow_the_documented_readout(packages: dict[str, Path], variant: str) -> None:
    model = load(packages[variant])
    body, _, results = serve(
        model,
        {
            "state": {"user": "what is 2 + 2", "answer": "4"},
            "questions": {"c": CHOICE, "n": NOUL, "b": NOUL_BOTH, "s": SCORE},
        },
    )
    scores = np.array([float(r[model.entailment] - r[model.contradiction]) for r in results])
    choice, noul, both, score = (body["answers"][k] for k in ("c", "n", "b", "s"))
    np.testing.assert_allclose(list(choice["probabilities"].values()), softmax(scores[0:3]), atol=1e-6)
    assert choice["choice"] == ["math", "code", "other"][int(np.argmax(scores[0:3]))]
    assert noul["noul"] == pytest.approx(float(sigmoid(np.asarray(scores[3]))), abs=1e-6)
    assert both["noul"] == pytest.approx(float(sigmoid(np.asarray(scores[4] - scores[5]))), abs=1e-6)
    probs = softmax(scores[6:10])
    np.testing.assert_allclose(list(score["probabilities"].values()), probs, atol=1e-6)
    assert score["score"] == pytest.approx(float(np.dot(np.arange(4), probs)), abs=1e-6)
    for answer in (choice, score):
        assert sum(answer["probabilities"].values()) == pytest.approx(1.0)
        assert 0.0 <= answer["confidence"] <= 1.0
    assert 0.0 <= score["score"] <= 3.0 and score["legend"]["3"] == "very hard"
    assert model.self_check() is None


@pytest.mark.parametrize("variant", VARIANTS)
def test_engine_logits_match_transformers(packages: dict[str, Path], variant: str) -> None:
    import torch
    from transformers import AutoModelForSequenceClassification

    model = load(packages[variant])
    _, plan, results = serve(model, {"state": "hello world", "questions": {"c": CHOICE}})
    reference = AutoModelForSequenceClassification.from_pretrained(
        packages[variant], attn_implementation="eager"
    )
    reference.eval()
    for item, result in zip(plan.items, results, strict=True):
        inputs = {"input_ids": torch.tensor([item.token_ids])}
        if item.type_ids is not None:
            inputs["token_type_ids"] = torch.tensor([item.type_ids])
        with torch.no_grad():
            expected = reference(**inputs).logits[0].numpy()
        np.testing.assert_allclose(result, expected, atol=1e-4)


def test_long_states_follow_options_overflow(packages: dict[str, Path]) -> None:
    model = load(packages["bert"])
    long_state = " ".join(["the movie was good"] * 60)
    body, _, _ = serve(model, {"state": long_state, "questions": {"c": CHOICE, "n": NOUL}})
    assert body["answers"]["c"]["error"] == "max_length_exceeded"
    assert "options.overflow" in body["answers"]["c"]["message"]
    request = {"state": long_state, "questions": {"c": CHOICE}, "options": {"overflow": "truncate"}}
    body, plan, _ = serve(model, request)
    assert "choice" in body["answers"]["c"]
    assert max(len(item.token_ids) for item in plan.items) == 128


def test_window_options_are_refused_not_ignored(packages: dict[str, Path]) -> None:
    from vllm_srun.errors import InvalidRequest

    model = load(packages["bert"])
    with pytest.raises(InvalidRequest, match=r"options\.overflow"):
        serve(model, {"state": "s", "questions": {"c": CHOICE}, "options": {"overflow": "window"}})
    # Decisions' options are a closed type: `window` is not one of them, refused as it decodes.
    with pytest.raises(msgspec.ValidationError, match="unknown field `window`"):
        serve(model, {"state": "s", "questions": {"c": CHOICE}, "options": {"window": {"tokens": 64}}})


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_set_reads_each_label_as_its_own_noul(packages: dict[str, Path], variant: str) -> None:
    model = load(packages[variant])
    question = {
        "type": "set",
        "instructions": "Which topics does it touch?",
        "labels": [{"key": "math", "description": "mathematics"}, {"key": "code"}],
    }
    assert templates.hypotheses(parse_question("t", question, "q")) == [
        "Which topics does it touch? Answer: mathematics.",
        "Which topics does it touch? Answer: code.",
    ]
    body, _, results = serve(model, {"state": "what is 2 + 2", "questions": {"t": question}})
    # The documented readout on the same float64 numbers the family reads (the engine's float32
    # logits widened before the subtraction), so the two agree exactly: a float32 subtraction
    # here would round differently (by up to ~1e-8 after the sigmoid) and fail by chance.
    scores = [float(np.float64(r[model.entailment]) - np.float64(r[model.contradiction])) for r in results]
    expected = {"math": float(sigmoid(np.asarray(scores[0]))), "code": float(sigmoid(np.asarray(scores[1])))}
    assert body["sets"]["t"]["probabilities"] == expected
    assert body["thresholds"] == {"t": 0.5} and list(body["answers"]) == ["t.math", "t.code"]
    assert model.info.question_types == ["choice", "noul", "score", "set"]
    assert set(model.info.presets) == {"domain", "needs_reasoning", "difficulty", "topics"}
