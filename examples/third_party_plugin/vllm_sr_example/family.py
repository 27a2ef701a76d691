"""`example_keywords`: a model format whose "model" is a JSON file of labels and keywords.

A text becomes term ids (1..V for the keywords, 0 for any other word); the counts engine
turns each row into a histogram; this family reads the histogram as label scores
(classify), a normalised keyword vector (embeddings) or a cosine (rerank). Every surface
reads the same per-text histogram, so one cached result serves all three.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from vllm_sr_example import FORMAT, MODEL_FILE
from vllm_sr_example.engine import ARCHITECTURE
from vllm_srun.errors import PackageError, UnsupportedSurface
from vllm_srun.plugins.base import (
    EmbeddingView,
    EngineModel,
    HeadInfo,
    ItemError,
    LoadedModel,
    ModelFamily,
    ModelInfo,
    ModelSpec,
    Plan,
    Result,
    Verification,
    WorkItem,
)
from vllm_srun.plugins.bodies import UnsupportedOption, check_profile, item_error_code
from vllm_srun.plugins.package import ModelPackage, combined_sha256
from vllm_srun.plugins.surfaces import (
    ClassifyResponse,
    ClassifyResult,
    Embedding,
    EmbeddingsRequest,
    EmbeddingsResponse,
    EmbeddingsUsage,
    InputUsage,
    Options,
    RerankRequest,
    RerankResponse,
    RerankResult,
    Usage,
    texts_of,
)
from vllm_srun.plugins.vectors import embedding_value, l2_normalize, softmax

_WORD = re.compile(r"\w+")
DEFAULT_MAX_TOKENS = 512
# Labels without keywords (e.g. "other") win when no keyword appears at all.
_FALLBACK_LOGIT = 0.5


def _read_config(package: ModelPackage) -> dict[str, Any]:
    config = package.read_json(MODEL_FILE)
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise PackageError(f"{MODEL_FILE}: 'format' must be {FORMAT!r}")
    labels = config.get("labels")
    if not isinstance(labels, list) or not labels or not all(isinstance(x, str) for x in labels):
        raise PackageError(f"{MODEL_FILE}: 'labels' must be a non-empty list of strings")
    keywords = config.get("keywords")
    if not isinstance(keywords, dict):
        raise PackageError(f"{MODEL_FILE}: 'keywords' must map labels to lists of words")
    surfaces = config.get("surfaces", list(KeywordFamily.surfaces))
    if not isinstance(surfaces, list) or not set(surfaces) <= set(KeywordFamily.surfaces):
        raise PackageError(f"{MODEL_FILE}: 'surfaces' must list some of {', '.join(KeywordFamily.surfaces)}")
    for label, words in keywords.items():
        if label not in labels:
            raise PackageError(f"{MODEL_FILE}: keywords.{label}: not one of the labels")
        if not isinstance(words, list) or not all(isinstance(w, str) and w for w in words):
            raise PackageError(f"{MODEL_FILE}: keywords.{label} must be a list of words")
    return config


class KeywordFamily(ModelFamily):
    surfaces = ("classify", "embeddings", "rerank")
    fixture_writer = "vllm_sr_example.fixtures:write_fixture"
    builtin_table = "vllm_sr_example.table"

    def detect(self, package: ModelPackage) -> bool:
        if not package.exists(MODEL_FILE):
            return False
        try:
            return bool(package.read_json(MODEL_FILE).get("format") == FORMAT)
        except (PackageError, AttributeError):
            return False

    def verify(self, package: ModelPackage) -> Verification:
        config = _read_config(package)
        files = package.digests([MODEL_FILE])
        return Verification(
            model_sha256=combined_sha256(files),
            files=files,
            max_tokens=int(config.get("max_tokens", DEFAULT_MAX_TOKENS)),
            licence=config.get("licence"),
        )

    def describe(self, package: ModelPackage) -> ModelSpec:
        config = _read_config(package)
        vocab = sorted({w.lower() for words in config["keywords"].values() for w in words})
        return ModelSpec(
            family=self.name,
            architecture=ARCHITECTURE,
            config={**config, "vocab": vocab, "vocab_size": len(vocab) + 1},
            weight_files=(package.path(MODEL_FILE),),
        )

    def load(
        self,
        package: ModelPackage,
        spec: ModelSpec,
        engine_model: EngineModel | None,
        *,
        name: str,
        verification: Verification,
        numerics: str,
    ) -> KeywordModel:
        vocab: list[str] = list(spec.config["vocab"])
        labels: list[str] = list(spec.config["labels"])
        info = ModelInfo(
            name=name,
            family=self.name,
            surfaces=list(spec.config.get("surfaces", self.surfaces)),
            model_sha256=verification.model_sha256,
            numerics=numerics,
            heads=[HeadInfo(name="keywords", kind="sequence", labels=labels)],
            embedding=EmbeddingView(dimension=len(vocab), normalized=True, pooling="counts"),
            max_tokens=verification.max_tokens,
            licence=verification.licence,
        )
        model = KeywordModel(info, engine_model, vocab=vocab, labels=labels, keywords=spec.config["keywords"])
        # A package may declare itself batch-variant, so the batching window can be seen at work.
        model.batch_invariant = bool(spec.config.get("batch_invariant", True))
        return model


class KeywordModel(LoadedModel):
    # A row's histogram never depends on its batch neighbours.
    batch_invariant: bool = True

    def __init__(
        self,
        info: ModelInfo,
        engine_model: EngineModel | None,
        *,
        vocab: list[str],
        labels: list[str],
        keywords: dict[str, list[str]],
    ) -> None:
        super().__init__(info, engine_model)
        self.ids = {word: i + 1 for i, word in enumerate(vocab)}
        self.labels = labels
        self.label_ids = [[self.ids[w.lower()] for w in keywords.get(label, [])] for label in labels]
        self.max_tokens = info.max_tokens or DEFAULT_MAX_TOKENS

    # -- planning ---------------------------------------------------------------------------

    def _budget(self, options: Options) -> int:
        """Tokens one input may have: `options.max_tokens`, at most the model's limit."""
        if options.max_tokens is not None and options.max_tokens > self.max_tokens:
            raise UnsupportedOption(
                f"options.max_tokens: {options.max_tokens} exceeds the model's limit of {self.max_tokens}",
                param="options.max_tokens",
            )
        return options.max_tokens or self.max_tokens

    def _item(self, text: str | list[int], options: Options) -> tuple[WorkItem | ItemError, InputUsage]:
        budget = self._budget(options)
        if isinstance(text, list):  # token ids (OpenAI's embeddings input): ours, unknown ones 0
            ids = [i if 0 < i <= len(self.ids) else 0 for i in text]
        else:
            ids = [self.ids.get(word, 0) for word in _WORD.findall(text.lower())]
        info = InputUsage(tokens=len(ids), processed_tokens=len(ids), truncated=False)
        if len(ids) > budget:
            if options.overflow == "reject":
                message = (
                    f"{len(ids)} tokens; at most {budget} are taken (options.max_tokens, options.overflow)"
                )
                return ItemError("max_length_exceeded", message), info
            ids = ids[:budget]
            info = InputUsage(tokens=info.tokens, processed_tokens=len(ids), truncated=True)
        return WorkItem(token_ids=ids), info

    def plan_surface(self, surface: str, request: Any) -> Plan:
        # What the document allows and this model does not take (a head, a layer, a window) is
        # the model's refusal: UnsupportedOption, a 422 naming the field (TEI's 424).
        options: Options = request.options
        check_profile(options, self.info.numerics)
        if options.overflow == "window":
            raise UnsupportedOption("options.overflow: 'window' is not supported by example_keywords")
        if surface in ("embeddings", "rerank") and options.output not in (None, "dense"):
            # Keyword counts are one dense vector: no sparse or per-token output to give.
            raise UnsupportedOption(
                f"options.output: example_keywords gives dense vectors only, not {options.output!r}"
            )
        if surface == "classify":
            if request.head_name() not in (None, "keywords"):
                raise UnsupportedOption(f"head: {request.head_name()!r}; this model's one head is 'keywords'")
            texts = [text + (" " + pair if pair else "") for text, pair in texts_of(request.input)]
        elif surface == "embeddings":
            texts = request.inputs()
            for field in ("layer", "input_type", "prompt_name", "prompt"):
                if getattr(request, field) is not None:
                    raise UnsupportedOption(f"{field}: example_keywords has one layer and no prompts")
            if request.dimensions is not None and request.dimensions > len(self.ids):
                raise UnsupportedOption(f"dimensions: at most {len(self.ids)} for this model")
        elif surface == "rerank":
            for field in ("layer", "dimensions"):
                if getattr(request, field) is not None:
                    raise UnsupportedOption(f"{field}: this model scores from one exit and takes no {field}")
            texts = [request.query] + [d if isinstance(d, str) else d.text for d in request.documents]
        else:
            raise UnsupportedSurface(f"model {self.info.name!r} does not serve {surface!r}")
        entries = [self._item(text, options) for text in texts]
        items = [entry for entry, _ in entries if isinstance(entry, WorkItem)]
        return Plan(surface=surface, items=items, state=(request, entries))

    # -- finishing --------------------------------------------------------------------------

    def finish_surface(self, plan: Plan, results: Sequence[Result]) -> Any:
        request, entries = plan.state
        produced = iter(results)
        aligned = [(next(produced) if isinstance(e, WorkItem) else e, info) for e, info in entries]
        if plan.surface == "classify":
            return self._classify(aligned)
        usage = sum(info.processed_tokens for _, info in aligned)
        if plan.surface == "embeddings":
            return self._embeddings(request, aligned, usage)
        if plan.surface == "rerank":
            return self._rerank(request, aligned, usage)
        raise UnsupportedSurface(f"the example family does not serve {plan.surface}")

    def _classify(self, aligned: list[tuple[Result, InputUsage]]) -> ClassifyResponse:
        out = []
        for index, (result, info) in enumerate(aligned):
            if isinstance(result, ItemError):
                code = item_error_code(result.code)
                out.append(ClassifyResult(index=index, input=info, error=code, message=result.message))
                continue
            logits = np.array(
                [result[ids].sum() if ids else _FALLBACK_LOGIT for ids in self.label_ids], dtype=np.float64
            )
            probs = softmax(logits)
            best = int(np.argmax(probs))
            out.append(
                ClassifyResult(
                    index=index,
                    label=self.labels[best],
                    score=float(probs[best]),
                    probabilities=[float(p) for p in probs],
                    input=info,
                )
            )
        tokens = sum(info.processed_tokens for _, info in aligned)
        return ClassifyResponse(
            model=self.info.name,
            head="keywords",
            kind="sequence",
            labels=self.labels,
            results=out,
            usage=Usage(input_tokens=tokens, output_tokens=0),
        )

    def _embeddings(
        self, request: EmbeddingsRequest, aligned: list[tuple[Result, InputUsage]], usage: int
    ) -> EmbeddingsResponse:
        data = []
        for index, (result, info) in enumerate(aligned):
            if isinstance(result, ItemError):
                code = item_error_code(result.code)
                data.append(
                    Embedding(index=index, object="embedding", input=info, error=code, message=result.message)
                )
                continue
            vector = embedding_value(
                l2_normalize(result[1:]),
                encoding_format=request.encoding_format,
                dimensions=request.dimensions,
            )
            data.append(Embedding(index=index, object="embedding", embedding=vector, input=info))
        usage_body = EmbeddingsUsage(prompt_tokens=usage, total_tokens=usage)
        return EmbeddingsResponse(data=data, model=self.info.name, usage=usage_body, object="list")

    def _rerank(
        self, request: RerankRequest, aligned: list[tuple[Result, InputUsage]], usage: int
    ) -> RerankResponse:
        query, _ = aligned[0]
        out = []
        for index, (result, info) in enumerate(aligned[1:]):
            document = request.documents[index]
            doc = document if isinstance(document, str) else document.text
            failed = (
                query if isinstance(query, ItemError) else result if isinstance(result, ItemError) else None
            )
            if failed is not None:
                message = f"{'query' if failed is query else 'document'}: {failed.message}"
                code = item_error_code(failed.code)
                out.append(RerankResult(index=index, input=info, error=code, message=message))
                continue
            score = float(np.dot(l2_normalize(query[1:]), l2_normalize(result[1:])))
            out.append(
                RerankResult(
                    index=index,
                    relevance_score=score,
                    document=doc if request.return_documents else None,
                    input=info,
                )
            )
        # Scored results by descending score, then failed ones; top_n bounds the list.
        out.sort(key=lambda r: (r.relevance_score is None, -(r.relevance_score or 0.0), r.index))
        if request.top_n is not None:
            out = out[: request.top_n]
        usage_body = Usage(input_tokens=usage, output_tokens=0, prompt_tokens=usage, total_tokens=usage)
        return RerankResponse(model=self.info.name, results=out, usage=usage_body)
