"""The yes/no-logit form of Qwen3-Reranker, served as sentence-transformers ships it.

The packages are written by sentence-transformers itself (`write_logit_score_reranker`): a tiny
random Qwen3ForCausalLM as a CrossEncoder of a Transformer (transformer_task "text-generation")
and a LogitScore module, with a Qwen3-Reranker-style chat template and prompts. Over real HTTP,
each score is compared with `CrossEncoder(path).predict(pairs)` on seeded random queries and
documents: `logit` with predict(activation_fn=Identity) (logit[yes] - logit[no]), and
`relevance_score` with predict() (its sigmoid), within 1e-4 (float32; the largest difference
seen is printed at the module's end with -s).

- `yes-no`: LM head tied to the input embeddings (as Qwen3-0.6B), true "yes" and false "no",
  prompts without a default: scored without a prompt, with `prompt_name`, with a raw `prompt`.
- `yes-only`: an untied lm_head, the "yes" logit alone, a default_prompt_name: the default
  applies unless the request names another prompt (or "" for none).
- `structured`: a template that reads typed message parts, no format saved: inferred as
  sentence-transformers infers it.
- An over-long pair truncated as sentence-transformers truncates it (the template's tail kept);
  windows refused; /v1/classify scores pairs too, and refuses a text without its pair.
- Refused with the reason: a bare Qwen3ForCausalLM (how to convert it, and that the LogitScore
  form serves), a template that reads the clock, one that drops the document, more modules.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from families.task_heads.harness import cross_encoder_predict, random_texts, rerank_over_http
from helpers import Server, serve_named

from vllm_srun.plugins.bodies import UnsupportedOption
from vllm_srun.testing.reranker_fixtures import write_logit_score_reranker
from vllm_srun.testing.task_heads_fixtures import write_fixture

pytestmark = pytest.mark.torch

PROMPTS = {
    "query": "given a web search query find the document that answers it",
    "city": "which city is the document about",
}
ATOL = 1e-4
MEASURED: list[float] = []


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("logit-score")
    yes_no = write_logit_score_reranker(root / "yes-no", prompts=PROMPTS)
    yes_only = write_logit_score_reranker(
        root / "yes-only", tied=False, false_token=None, prompts=PROMPTS, default_prompt_name="query"
    )
    plain = write_fixture(root / "qwen3-reranker", variant="qwen3-reranker")
    return {
        "yes-no": yes_no,
        "yes-only": yes_only,
        "structured": _structured(yes_no, root),
        "qwen3-reranker": plain,
    }


def _structured(source: Path, root: Path) -> Path:
    """`source` with a template that reads each message's content as typed parts and no message
    format saved: sentence-transformers infers "structured" from the template, as must we."""
    path = Path(shutil.copytree(source, root / "structured"))
    template = (path / "chat_template.jinja").read_text()
    assert template.count(".content }}") == 2 and "message.content %}" in template
    template = template.replace(".content }}", ".content[0].text }}")
    (path / "chat_template.jinja").write_text(
        template.replace("message.content %}", "message.content[0].text %}")
    )
    settings = json.loads((path / "sentence_bert_config.json").read_text())
    del settings["modality_config"]["message"]["format"]
    (path / "sentence_bert_config.json").write_text(json.dumps(settings, indent=2))
    return path


@pytest.fixture(scope="module")
def server(module_server: Callable[..., Server], packages: dict[str, Path]) -> Server:
    return module_server(*serve_named(packages), "--threads", "1")


@pytest.fixture(scope="module")
def cross_encoders(packages: dict[str, Path]) -> dict[str, Any]:
    from sentence_transformers import CrossEncoder

    return {
        name: CrossEncoder(str(packages[name]), device="cpu") for name in ("yes-no", "yes-only", "structured")
    }


@pytest.fixture(scope="module", autouse=True)
def report() -> Any:
    """With -s, the largest difference from CrossEncoder.predict seen in the module."""
    yield
    if MEASURED:
        print(
            f"\nlargest |logit - CrossEncoder.predict| {max(MEASURED):.2e} over {len(MEASURED)} comparisons"
        )


def _assert_matches(got: tuple[np.ndarray, np.ndarray], want: tuple[np.ndarray, np.ndarray]) -> None:
    MEASURED.append(float(np.max(np.abs(got[0] - want[0]))))
    np.testing.assert_allclose(got[0], want[0], atol=ATOL, rtol=0)
    np.testing.assert_allclose(got[1], want[1], atol=ATOL, rtol=0)


def test_the_fixture_is_the_form_sentence_transformers_saves(packages: dict[str, Path]) -> None:
    from safetensors import safe_open

    path = packages["yes-no"]
    modules = json.loads((path / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["Transformer", "LogitScore"]
    assert (
        json.loads((path / "sentence_bert_config.json").read_text())["transformer_task"] == "text-generation"
    )
    assert (path / "chat_template.jinja").exists()
    assert json.loads((path / "config_sentence_transformers.json").read_text())["prompts"] == PROMPTS
    head = json.loads((path / "1_LogitScore" / "config.json").read_text())
    assert head["false_token_id"] is not None and head["true_token_id"] != head["false_token_id"]
    for name, tied in (("yes-no", True), ("yes-only", False)):
        config = json.loads((packages[name] / "config.json").read_text())
        assert (config["architectures"], config["tie_word_embeddings"]) == (["Qwen3ForCausalLM"], tied)
        with safe_open(str(packages[name] / "model.safetensors"), framework="np") as f:
            assert ("lm_head.weight" in f.keys()) is not tied
    assert (
        json.loads((packages["yes-only"] / "1_LogitScore" / "config.json").read_text())["false_token_id"]
        is None
    )


@pytest.mark.parametrize("prompt", [None, "query", "raw"])
def test_rerank_matches_cross_encoder_predict(
    server: Server, cross_encoders: dict[str, Any], prompt: str | None
) -> None:
    seed = {None: 1, "query": 2, "raw": 3}[prompt]
    query = random_texts(seed=seed, count=1, max_words=10)[0]
    documents = random_texts(seed=seed + 10, count=12, max_words=40)
    pairs = [(query, d) for d in documents]
    raw = "tell me if " + random_texts(seed=seed + 20, count=1, max_words=6)[0]
    extra = {None: {}, "query": {"prompt_name": "query"}, "raw": {"prompt": raw}}[prompt]
    reference = {None: {}, "query": {"prompt_name": "query"}, "raw": {"prompt": raw}}[prompt]
    got = rerank_over_http(server, "yes-no", query, documents, **extra)
    want = cross_encoder_predict(cross_encoders["yes-no"], pairs, **reference)
    _assert_matches(got, want)
    if prompt is not None:
        # The instruction changes the scores: a server that dropped it would not pass above.
        plain = cross_encoder_predict(cross_encoders["yes-no"], pairs)
        assert np.max(np.abs(plain[0] - want[0])) > 1e-3


def test_the_default_prompt_applies_and_the_true_logit_alone_scores(
    server: Server, cross_encoders: dict[str, Any]
) -> None:
    query = random_texts(seed=31, count=1, max_words=8)[0]
    documents = random_texts(seed=32, count=8, max_words=30)
    pairs = [(query, d) for d in documents]
    model = cross_encoders["yes-only"]
    _assert_matches(
        rerank_over_http(server, "yes-only", query, documents), cross_encoder_predict(model, pairs)
    )
    _assert_matches(
        rerank_over_http(server, "yes-only", query, documents, prompt=""),
        cross_encoder_predict(model, pairs, prompt=""),
    )
    _assert_matches(
        rerank_over_http(server, "yes-only", query, documents, prompt_name="city"),
        cross_encoder_predict(model, pairs, prompt_name="city"),
    )


def test_typed_message_parts_when_the_template_reads_them(
    server: Server, cross_encoders: dict[str, Any]
) -> None:
    model = cross_encoders["structured"]
    assert model[0].input_formatter.message_format == "structured"  # inferred from the template
    query = random_texts(seed=71, count=1, max_words=8)[0]
    documents = random_texts(seed=72, count=6, max_words=30)
    pairs = [(query, d) for d in documents]
    _assert_matches(
        rerank_over_http(server, "structured", query, documents), cross_encoder_predict(model, pairs)
    )
    _assert_matches(
        rerank_over_http(server, "structured", query, documents, prompt_name="city"),
        cross_encoder_predict(model, pairs, prompt_name="city"),
    )


def test_an_overlong_pair_is_truncated_as_sentence_transformers_truncates_it(
    server: Server, cross_encoders: dict[str, Any]
) -> None:
    query = random_texts(seed=41, count=1, max_words=8)[0]
    documents = [
        " ".join(random_texts(seed=42, count=30, max_words=20)),
        *random_texts(seed=43, count=3, max_words=20),
    ]
    model = cross_encoders["yes-no"]
    assert len(model[0].preprocess([(query, documents[0])])["input_ids"][0]) == model.max_seq_length  # cut
    want = cross_encoder_predict(model, [(query, d) for d in documents])
    got = rerank_over_http(server, "yes-no", query, documents, options={"overflow": "truncate"})
    _assert_matches(got, want)
    response = server.post("/v1/rerank", {"model": "yes-no", "query": query, "documents": documents})
    assert response.status_code == 200, response.text
    first = next(r for r in response.json()["results"] if r["index"] == 0)
    assert first["error"] == "max_length_exceeded"  # reject, the default, names it


def test_windows_are_refused(server: Server) -> None:
    response = server.post(
        "/v1/rerank",
        {
            "model": "yes-no",
            "query": "a query",
            "documents": ["a document"],
            "options": {"overflow": "window"},
        },
    )
    assert response.status_code == 422, response.text
    assert response.json()["error"]["param"] == "options.overflow"


def test_classify_scores_pairs_and_refuses_a_text_alone(
    server: Server, cross_encoders: dict[str, Any]
) -> None:
    query = random_texts(seed=51, count=1, max_words=8)[0]
    documents = random_texts(seed=52, count=4, max_words=20)
    response = server.post(
        "/v1/classify", {"model": "yes-no", "input": [{"text": query, "text_pair": d} for d in documents]}
    )
    assert response.status_code == 200, response.text
    got = [result["score"] for result in sorted(response.json()["results"], key=lambda r: r["index"])]
    _, want = cross_encoder_predict(cross_encoders["yes-no"], [(query, d) for d in documents])
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), want, atol=ATOL, rtol=0)
    response = server.post("/v1/classify", {"model": "yes-no", "input": ["a text without its pair"]})
    assert response.status_code == 422, response.text
    assert response.json()["error"]["param"] == "input[0].text_pair"


@pytest.mark.parametrize(
    ("model", "extra", "status", "param"),
    [
        ("yes-no", {"prompt_name": "nope"}, 422, "prompt_name"),
        ("yes-no", {"prompt_name": "query", "prompt": "x"}, 400, "prompt_name"),
        # A cross-encoder takes a raw prompt (test_cross_encoder.py), a name only of its prompts.
        ("qwen3-reranker", {"prompt_name": "x"}, 422, "prompt_name"),
        # Rendered into every pair: bounded in characters before any is tokenized.
        ("yes-no", {"prompt": "yes " * 2000}, 413, "prompt"),
    ],
)
def test_prompt_refusals_name_the_field(
    server: Server, model: str, extra: dict[str, str], status: int, param: str
) -> None:
    response = server.post("/v1/rerank", {"model": model, "query": "q", "documents": ["d"], **extra})
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == param


def _refusal(path: Path) -> str:
    from vllm_srun.errors import ConfigError, PackageError
    from vllm_srun.families.task_heads.family import TaskHeadsFamily
    from vllm_srun.plugins.discovery import load_plugins
    from vllm_srun.plugins.package import ModelPackage
    from vllm_srun.registry.loader import detect_family

    package = ModelPackage(path)
    with pytest.raises((ConfigError, PackageError)) as caught:
        family = detect_family(load_plugins(), package)
        assert isinstance(family, TaskHeadsFamily)
        verification = family.verify(package)
        family.load(
            package,
            family.describe(package),
            None,
            name=path.name,
            verification=verification,
            numerics="float32",
        )
    return str(caught.value)


def _variant(packages: dict[str, Path], tmp_path: Path, edit: Callable[[Path], None]) -> Path:
    path = Path(shutil.copytree(packages["yes-no"], tmp_path / "variant"))
    edit(path)
    return path


def test_a_bare_causal_lm_is_refused_with_how_to_convert_it(
    packages: dict[str, Path], tmp_path: Path
) -> None:
    message = _refusal(_variant(packages, tmp_path, lambda p: (p / "modules.json").unlink()))
    assert "Qwen3ForCausalLM" in message
    assert "one-label Qwen3ForSequenceClassification" in message and "lm_head.weight" in message
    assert "LogitScore" in message  # and that the sentence-transformers form serves as shipped


def _template_edit(old: str, new: str) -> Callable[[Path], None]:
    def edit(path: Path) -> None:
        template = path / "chat_template.jinja"
        text = template.read_text()
        assert old in text
        template.write_text(text.replace(old, new))

    return edit


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (_template_edit("<|im_start|>user", '<|im_start|>user {{ strftime_now("%Y") }}'), "strftime_now"),
        (
            _template_edit('{{ (messages | selectattr("role", "eq", "document") | first).content }}', "x"),
            "document",
        ),
        (_template_edit("<|im_start|>user", "{{ messages.__class__.__mro__ }}"), "sandbox"),
    ],
    ids=["reads-the-clock", "drops-the-document", "escapes-the-sandbox"],
)
def test_a_template_the_sandbox_cannot_serve_is_refused(
    packages: dict[str, Path], tmp_path: Path, edit: Callable[[Path], None], named: str
) -> None:
    assert named in _refusal(_variant(packages, tmp_path, edit))


def test_other_modules_are_refused(packages: dict[str, Path], tmp_path: Path) -> None:
    def add_module(path: Path) -> None:
        modules = json.loads((path / "modules.json").read_text())
        modules.append(
            {"idx": 2, "name": "2", "path": "", "type": "sentence_transformers.base.modules.Normalize"}
        )
        (path / "modules.json").write_text(json.dumps(modules))

    message = _refusal(_variant(packages, tmp_path, add_module))
    assert "modules.json" in message and "Normalize" in message


def test_vllm_score_gives_the_same_scores(server: Server, cross_encoders: dict[str, Any]) -> None:
    """An adapter onto the same surface: vLLM's /v1/score answers predict()'s sigmoid, and its
    logit with use_activation false."""
    query = random_texts(seed=61, count=1, max_words=8)[0]
    documents = random_texts(seed=62, count=5, max_words=20)
    want = cross_encoder_predict(cross_encoders["yes-no"], [(query, d) for d in documents])
    for use_activation, expected in ((True, want[1]), (False, want[0])):
        body = {"model": "yes-no", "text_1": query, "text_2": documents, "use_activation": use_activation}
        response = server.post("/v1/score", body)
        assert response.status_code == 200, response.text
        got = [d["score"] for d in sorted(response.json()["data"], key=lambda d: d["index"])]
        np.testing.assert_allclose(np.asarray(got, dtype=np.float64), expected, atol=ATOL, rtol=0)


def test_the_card_says_the_head_takes_pairs(server: Server) -> None:
    cards = {card["id"]: card for card in server.get("/v1/models").json()["data"]}
    assert "rerank" in cards["yes-no"]["surfaces"]
    assert [head["inputs"] for head in cards["yes-no"]["heads"]] == [["pair"]]  # never a text alone


def test_the_score_head_is_built_from_the_lm_head_rows(
    packages: dict[str, Path], th: Any, tmp_path: Path
) -> None:
    """On the native engine: the tied package's score row is embed_tokens[yes] - embed_tokens[no];
    an untied package without its lm_head is refused naming the tensor it needed."""
    import torch
    from safetensors.torch import load_file, save_file

    from vllm_srun.errors import PackageError

    model = th.load_path(packages["yes-no"], "native", name="tied")
    module = model.engine_model.module
    head = json.loads((packages["yes-no"] / "1_LogitScore" / "config.json").read_text())
    embed = load_file(str(packages["yes-no"] / "model.safetensors"))["model.embed_tokens.weight"]
    want = embed[head["true_token_id"]] - embed[head["false_token_id"]]
    torch.testing.assert_close(module.score.weight[0], want, atol=0, rtol=0)

    untied = Path(shutil.copytree(packages["yes-only"], tmp_path / "untied"))
    tensors = load_file(str(untied / "model.safetensors"))
    del tensors["lm_head.weight"]
    save_file(tensors, str(untied / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(PackageError, match=r"lm_head\.weight"):
        th.load_path(untied, "native", name="untied")


def test_a_template_that_refuses_one_input_is_the_models_422(
    packages: dict[str, Path], tmp_path: Path
) -> None:
    """A template's raise_exception, reached only by some contents, refuses that document (the
    load-time probes do not reach it), naming it: never a 500."""
    from vllm_srun.families.task_heads.family import TaskHeadsFamily
    from vllm_srun.plugins.package import ModelPackage
    from vllm_srun.plugins.surfaces import RerankRequest

    guard = (
        '{% if "terrible" in (messages | selectattr("role", "eq", "document") | first).content %}'
        '{{ raise_exception("no terrible documents") }}{% endif %}<|im_start|>user'
    )
    path = _variant(packages, tmp_path, _template_edit("<|im_start|>user", guard))
    family, package = TaskHeadsFamily(), ModelPackage(path)
    model = family.load(
        package,
        family.describe(package),
        None,
        name="guarded",
        verification=family.verify(package),
        numerics="float32",
    )
    model.plan_surface("rerank", RerankRequest(query="a query", documents=["a good film"]))
    with pytest.raises(UnsupportedOption) as caught:
        model.plan_surface(
            "rerank", RerankRequest(query="a query", documents=["a good film", "a terrible film"])
        )
    assert caught.value.param == "documents[1]" and "no terrible documents" in str(caught.value)


def test_every_engine_path_of_the_score_head_agrees_with_packed_rows(
    packages: dict[str, Path], th: Any
) -> None:
    """The LogitScore head is no row of tests/engines/test_parity.py (its package is a
    sentence-transformers CrossEncoder, not a Transformers class), so its small-batch paths are
    checked here: each gives the packed rows' logits (1e-5), one row alone and three together."""
    from vllm_srun.plugins.base import Batch, WorkItem

    native = th.load_path(packages["yes-no"], "native", name="paths").engine_model
    assert native.paths[0] == "packed" and len(native.paths) > 1, native.paths
    vocab = int(json.loads((packages["yes-no"] / "config.json").read_text())["vocab_size"])
    rng = np.random.default_rng(7)
    rows = [[int(t) for t in rng.integers(1, vocab, size=n)] for n in (5, 23, 1)]
    for batch in [[r] for r in rows] + [rows]:

        def run(path: str, batch: list[list[int]] = batch) -> list[np.ndarray]:
            items = [WorkItem(token_ids=r, output="logits") for r in batch]
            return list(native.encode(Batch.from_items(items), path=path))

        packed = run("packed")
        for path in native.paths[1:]:
            for got, want in zip(run(path), packed, strict=True):
                np.testing.assert_allclose(got, want, atol=1e-5, rtol=0, err_msg=f"path {path}")
