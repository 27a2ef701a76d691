"""What the task_heads tests share: the `Harness` behind the `th` fixture, the texts, and the
numerics the answers are checked against.

Tests run every surface the way the server does: `plan_surface` -> `LoadedModel.run(items)`
(one batch) -> `finish_surface`, and compare with Transformers (eager attention, float32) at
`ATOL`.

Two kinds of fixture package are written, once per session:
- `th.plan_package(variant)`: tokenizer and config.json, a weights file with no tensors. Written
  without torch; enough for detect/verify/load and everything that plans or finishes with the
  tokenizer alone (`th.load(variant, None)` uses it).
- `th.package(variant)`: random weights and an ONNX graph, written with torch; engines run it and
  Transformers is the reference. Tests that need it are marked `@pytest.mark.torch`.

Imported by the test modules as `families.task_heads.harness` (`tests/` is on the path).
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, overload

import numpy as np
import pytest

from vllm_srun.families.task_heads import TaskHeadsFamily
from vllm_srun.families.task_heads.model import TaskHeadsModel
from vllm_srun.plugins.architectures import uses_type_ids
from vllm_srun.plugins.base import Batch, Device, EngineModel, ItemError, Result
from vllm_srun.plugins.package import ModelPackage
from vllm_srun.plugins.surfaces import (
    ClassifyRequest,
    ClassifyResponse,
    EmbeddingsRequest,
    EmbeddingsResponse,
    RerankRequest,
    RerankResponse,
)

Surface = Literal["classify", "embeddings", "rerank"]
Request = ClassifyRequest | EmbeddingsRequest | RerankRequest
Tamper = Callable[[list[Result]], list[Result]]

HAVE_TORCH = importlib.util.find_spec("torch") is not None


def _native_importable() -> bool:
    if not HAVE_TORCH:
        return False
    try:
        from vllm_srun.engines.native import NativeEngine  # noqa: F401
    except ImportError:
        return False
    return True


# The ONNX engine always runs these tests; the native engine joins when it imports.
ENGINES: list[str] = ["onnxruntime", *(["native"] if _native_importable() else [])]
ATOL = 1e-4

# Mixed lengths in one batch; the longer ones exceed ModernBERT's local window of 8.
TEXTS = [
    "good",
    "John Smith lives in Paris and works at Google.",
    "what a terrible movie , i hate it",
    "Mary visited London, Berlin and New York City last year with her dog and cat because she "
    "wanted to see many people and many other things",
    "",
]
MULTIBYTE = "Café résumé: Zoë met John Smith in 北京 😀 and Paris, naïve 中文 text 👩‍👩‍👧 ok."
LONG = " ".join(["john smith lives in paris and works at google in new york city"] * 20)  # 260+ tokens


def random_texts(seed: int, count: int, max_words: int) -> list[str]:
    """Texts the tests did not choose: 1..max_words fixture words drawn by a seeded RNG, some
    capitalised, some ending in punctuation."""
    from vllm_srun.testing.tokenizer_fixtures import WORDS

    rng = np.random.default_rng(seed)
    texts = []
    for _ in range(count):
        words = [str(w) for w in rng.choice(WORDS, size=int(rng.integers(1, max_words + 1)))]
        words = [w.capitalize() if rng.random() < 0.2 else w for w in words]
        if rng.random() < 0.5:
            words[-1] += str(rng.choice(list(".?!,")))
        texts.append(" ".join(words))
    return texts


# Reference numerics, in float64 -------------------------------------------------------------


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    out: np.ndarray = e / e.sum(-1, keepdims=True)
    return out


def sigmoid(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = 1 / (1 + np.exp(-x))
    return out


def unit(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = x / np.linalg.norm(x)
    return out


def pool(hidden: np.ndarray, mode: str) -> np.ndarray:
    out: np.ndarray = {"mean": hidden.mean(0), "cls": hidden[0], "last": hidden[-1]}[mode]
    return out


def cross_encoder_predict(
    model: Any, pairs: list[tuple[str, str]], **kwargs: Any
) -> tuple[np.ndarray, np.ndarray]:
    """(logits, scores) of a sentence-transformers CrossEncoder: `predict` without and with its
    activation."""
    import torch

    logits = model.predict(pairs, activation_fn=torch.nn.Identity(), **kwargs)
    scores = model.predict(pairs, **kwargs)
    return np.asarray(logits, dtype=np.float64), np.asarray(scores, dtype=np.float64)


def rerank_over_http(
    server: Any, model: str, query: str, documents: list[str], **extra: Any
) -> tuple[np.ndarray, np.ndarray]:
    """(logit, relevance_score) of each document, in input order, from the server's /v1/rerank."""
    response = server.post("/v1/rerank", {"model": model, "query": query, "documents": documents, **extra})
    assert response.status_code == 200, response.text
    results = {r["index"]: r for r in response.json()["results"]}
    logits = np.array([results[i]["logit"] for i in range(len(documents))])
    scores = np.array([results[i]["relevance_score"] for i in range(len(documents))])
    return logits, scores


def rows_of(model: TaskHeadsModel, surface: Surface, request: Request) -> tuple[list[list[int]], list[Any]]:
    """The token ids and token type ids (None for single texts) of each work item the request plans."""
    plan = model.plan_surface(surface, request)
    return [i.token_ids for i in plan.items], [i.type_ids for i in plan.items]


def fail_item(index: int, code: str = "unavailable") -> Tamper:
    """A `tamper` for `Harness.roundtrip` that answers work item `index` with an item error."""

    def tamper(results: list[Result]) -> list[Result]:
        results[index] = ItemError(code, "injected")
        return results

    return tamper


def make_engine(name: str) -> Any:
    if name == "native":
        from vllm_srun.engines.native import NativeEngine

        return NativeEngine()
    from vllm_srun.engines.onnxruntime import OnnxRuntimeEngine

    return OnnxRuntimeEngine()


class Harness:
    """Fixture packages, loaded models (cached per variant and engine) and the Transformers reference."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.family = TaskHeadsFamily()
        self._models: dict[tuple[str, str | None], TaskHeadsModel] = {}
        self._refs: dict[str, Any] = {}

    def package(self, variant: str) -> Path:
        """The full package `variant`: weights and an ONNX graph. Writing it needs torch."""
        pytest.importorskip("torch", reason="writing fixture weights needs torch")
        return self._write(self.root / "full" / variant, variant, weights=True)

    def plan_package(self, variant: str) -> Path:
        """The package `variant` without tensors: written and served without torch."""
        return self._write(self.root / "plan" / variant, variant, weights=False)

    @staticmethod
    def _write(path: Path, variant: str, *, weights: bool) -> Path:
        from vllm_srun.testing.task_heads_fixtures import write_fixture

        if not (path / "config.json").exists():
            write_fixture(path, variant=variant, onnx=weights, weights=weights)
        return path

    def load_path(self, path: Path, engine: str | None, name: str = "m") -> TaskHeadsModel:
        package = ModelPackage(path)
        assert self.family.detect(package)
        verification = self.family.verify(package)
        spec = self.family.describe(package)
        engine_model = None
        if engine is not None:
            runner = make_engine(engine)
            reason = runner.supports(spec, Device("cpu"))
            if reason is not None:
                pytest.skip(f"{engine} cannot run {spec.architecture}: {reason}")
            engine_model = runner.load(spec, Device("cpu"), "float32", runner.read(spec, "float32"))
        return self.family.load(
            package, spec, engine_model, name=name, verification=verification, numerics="float32"
        )

    def load(self, variant: str, engine: str | None) -> TaskHeadsModel:
        """`variant` on `engine`; without an engine, the tokenizer-only model of `plan_package`."""
        key = (variant, engine)
        if key not in self._models:
            path = self.package(variant) if engine is not None else self.plan_package(variant)
            self._models[key] = self.load_path(path, engine, name=variant)
        return self._models[key]

    @overload
    @staticmethod
    def roundtrip(
        model: TaskHeadsModel,
        surface: Literal["classify"],
        request: ClassifyRequest,
        tamper: Tamper | None = None,
    ) -> ClassifyResponse: ...
    @overload
    @staticmethod
    def roundtrip(
        model: TaskHeadsModel,
        surface: Literal["embeddings"],
        request: EmbeddingsRequest,
        tamper: Tamper | None = None,
    ) -> EmbeddingsResponse: ...
    @overload
    @staticmethod
    def roundtrip(
        model: TaskHeadsModel,
        surface: Literal["rerank"],
        request: RerankRequest,
        tamper: Tamper | None = None,
    ) -> RerankResponse: ...
    @staticmethod
    def roundtrip(
        model: TaskHeadsModel, surface: Surface, request: Request, tamper: Tamper | None = None
    ) -> Any:
        """plan -> one run over every item -> finish; `tamper(results)` may inject item errors."""
        plan = model.plan_surface(surface, request)
        results: list[Result] = list(model.run(plan.items)) if plan.items else []
        if tamper is not None:
            results = tamper(results)
        return model.finish_surface(plan, results)

    def hf(self, path: Path) -> Any:
        import torch
        import transformers

        key = str(path)
        if key not in self._refs:
            config = json.loads((path / "config.json").read_text())
            cls = getattr(transformers, config["architectures"][0])
            model = cls.from_pretrained(str(path), attn_implementation="eager", dtype=torch.float32)
            self._refs[key] = model.eval()
        return self._refs[key]

    def reference(
        self, path: Path, rows: Sequence[Sequence[int]], type_rows: Sequence[Sequence[int]] | None = None
    ) -> list[np.ndarray]:
        """Transformers outputs per row (logits [L], token logits [T, L] or hidden [T, H]) from one
        right-padded batch."""
        import torch

        model = self.hf(path)
        width = max(len(r) for r in rows)
        pad = int(model.config.pad_token_id or 0)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        types = torch.zeros(len(rows), width, dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1
            if type_rows is not None:
                types[i, : len(row)] = torch.tensor(type_rows[i])
        kwargs = {"input_ids": ids, "attention_mask": mask}
        if uses_type_ids(model.config.to_dict()):
            kwargs["token_type_ids"] = types
        with torch.no_grad():
            out = model(**kwargs)
        if hasattr(out, "logits"):
            logits = out.logits.numpy()
            if logits.ndim == 2:
                return [logits[i] for i in range(len(rows))]
            return [logits[i, : len(r)] for i, r in enumerate(rows)]
        hidden = out.last_hidden_state.numpy()
        return [hidden[i, : len(r)] for i, r in enumerate(rows)]


# A fake engine for span tests ----------------------------------------------------------------


class TaggingEngine(EngineModel):
    """A fake engine that tags by vocabulary: person and place words get BIO tags, so spans are
    known exactly. Token ids come from the fixture's real tokenizer."""

    def __init__(self, vocab: dict[str, int], labels: list[str]) -> None:
        self.labels = labels
        self.by_id = {i: t for t, i in vocab.items()}
        self.dtype = "float32"

    def _label(self, token: str, previous: str) -> str:
        word = token.lower().lstrip("ġ▁#")
        if word in {"john", "smith", "mary", "zoë"}:
            return "I-PER" if previous.endswith("PER") else "B-PER"
        if word in {"paris", "london", "new", "york", "city"}:
            return "I-LOC" if previous.endswith("LOC") else "B-LOC"
        return "O"

    def encode(self, batch: Batch) -> list[np.ndarray]:
        rows = []
        for i in range(len(batch)):
            ids = batch.row(i).tolist()
            logits = np.zeros((len(ids), len(self.labels)), dtype=np.float32)
            previous = "O"
            for t, token_id in enumerate(ids):
                previous = self._label(self.by_id[token_id], previous)
                logits[t, self.labels.index(previous)] = 5.0
            rows.append(logits)
        return rows


def tagging_model(th: Harness, variant: str) -> TaskHeadsModel:
    """The tokenizer-only `variant` (a token classifier) answering through `TaggingEngine`."""
    model = th.load_path(th.plan_package(variant), None)
    model.engine_model = TaggingEngine(model.encoder.tokenizer.get_vocab(), model.labels)
    return model
