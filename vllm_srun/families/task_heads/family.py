"""`TaskHeadsFamily`: encoders with a task head, of every architecture the table declares.

Serves `*ForSequenceClassification` (classify; rerank for one- and two-label models),
`*ForTokenClassification` (classify with spans) and sentence-transformers `*Model` packages
(embeddings; rerank by cosine). The family imports neither torch nor onnxruntime: an app
replica plans and finishes with the tokenizer alone.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec

from vllm_srun.errors import ConfigError, PackageError
from vllm_srun.families.task_heads import colbert as pylate
from vllm_srun.families.task_heads.heads import POOLED, SURFACES_OF, heads_for, surfaces_of
from vllm_srun.families.task_heads.layout import Layout, kind_of, read_layout
from vllm_srun.families.task_heads.logit_score import PairTemplate
from vllm_srun.families.task_heads.model import TaskHeadsModel
from vllm_srun.families.task_heads.outputs import output_kinds
from vllm_srun.families.task_heads.sentence import declared_layers, load_post_pooling
from vllm_srun.families.task_heads.tokenize import TextEncoder
from vllm_srun.plugins.architectures import supported_model_types, uses_type_ids
from vllm_srun.plugins.base import (
    EmbeddingView,
    EngineModel,
    HeadInfo,
    ModelFamily,
    ModelInfo,
    ModelSpec,
    RerankExit,
    RerankView,
    Verification,
)
from vllm_srun.plugins.package import ModelPackage, checkpoint_spec, combined_sha256


def labels_of(config: dict[str, Any]) -> list[str]:
    """Labels in class-index order; `LABEL_i` where config.json names none."""
    id2label = config.get("id2label") or {}
    count = max(int(config.get("num_labels") or 0), len(id2label), 0)
    if count == 0:
        return []
    named = {int(k): str(v) for k, v in id2label.items()}
    return [named.get(i, f"LABEL_{i}") for i in range(count)]


class TaskHeadsFamily(ModelFamily):
    """Sequence classifiers, token taggers, cross-encoders and embedders of every architecture
    in vllm_srun.plugins.architectures (and of any model type with an ONNX graph)."""

    name = "task_heads"
    surfaces = ("classify", "embeddings", "rerank")
    looks_for = (
        "config.json naming an architecture it serves (BERT, RoBERTa, XLM-R, DeBERTa-v2, ModernBERT, "
        "ELECTRA, DistilBERT, MPNet, Qwen3 and more) beside *.safetensors weights, or any model_type "
        "beside an ONNX graph (onnx/model.onnx or model.onnx)"
    )
    fixture_writer = "vllm_srun.testing.task_heads_fixtures:write_fixture"

    def detect(self, package: ModelPackage) -> bool:
        if not package.exists("config.json"):
            return False
        try:
            config = package.read_json("config.json")
        except PackageError:
            return False
        return isinstance(config, dict) and kind_of(config, package) is not None

    def verify(self, package: ModelPackage) -> Verification:
        layout = read_layout(package)
        files = package.digests(layout.files(), state_dicts=list(layout.state_dicts.values()))
        return Verification(model_sha256=combined_sha256(files), files=files, max_tokens=layout.max_tokens)

    def describe(self, package: ModelPackage) -> ModelSpec:
        layout = read_layout(package)
        spec = checkpoint_spec(self.name, package, layout.config, layout.weight_files, layout.onnx)
        if not layout.output_heads:
            return spec
        extra = {
            **spec.extra,
            "outputs": layout.output_heads,
            "state_dicts": {
                prefix: package.path(name, state_dict=True) for prefix, name in layout.state_dicts.items()
            },
        }
        return dataclasses.replace(spec, extra=extra)

    def load(
        self,
        package: ModelPackage,
        spec: ModelSpec,
        engine_model: EngineModel | None,
        *,
        name: str,
        verification: Verification,
        numerics: str,
    ) -> TaskHeadsModel:
        layout = read_layout(package)
        labels = labels_of(layout.config)
        if layout.kind not in ("embedding", "sparse") and not labels:
            raise PackageError(f"config.json of {package.name!r} names no labels (id2label/num_labels)")
        heads = heads_for(layout.kind, labels, layout.config.get("problem_type"))
        if layout.logit_score is not None:  # its chat template formats (query, document) pairs only
            heads = [msgspec.structs.replace(h, inputs=["pair"]) for h in heads]
        embedding = (
            _embedding_view(layout, engine_model, spec) if any(h.kind == POOLED for h in heads) else None
        )
        info = ModelInfo(
            name=name,
            family=self.name,
            surfaces=surfaces_of(heads),
            model_sha256=verification.model_sha256,
            numerics=numerics,
            heads=heads,
            embedding=embedding,
            rerank=_rerank_view(layout, heads, embedding),
            max_tokens=verification.max_tokens or layout.max_tokens,
            licence=verification.licence,
        )
        sentence = layout.sentence
        lowercase = (
            (sentence is not None and sentence.do_lower_case)
            or (layout.sparse_encoder is not None and layout.sparse_encoder.do_lower_case)
            or (layout.colbert is not None and layout.colbert.do_lower_case)
        )
        encoder = TextEncoder(package.read_bytes("tokenizer.json"), lowercase=lowercase)
        vocab = layout.config.get("vocab_size")
        ids = encoder.tokenizer.get_vocab_size(with_added_tokens=True)
        if isinstance(vocab, int) and ids > vocab:
            # An id past the embedding table fails every batch it is in, at forward time.
            raise PackageError(
                f"tokenizer.json of {package.name!r} has {ids} token ids; config.json's vocab_size is {vocab}"
            )
        kinds = output_kinds(layout, encoder, package).on_engine(engine_model)
        if "embeddings" in info.surfaces:
            info.outputs = kinds.served()
            if not info.outputs:  # nothing a request could ask for: refused now, not per request
                reasons = "; ".join(f"{kind}: {why}" for kind, why in kinds.refused.items())
                raise ConfigError(f"model {name!r} gives none of its outputs on this engine ({reasons})")
        codec = None
        if layout.colbert is not None:
            settings = package.read_json(layout.tokenizer_config) if layout.tokenizer_config else {}
            settings = settings if isinstance(settings, dict) else {}
            codec = pylate.codec(layout.colbert, encoder.tokenizer, settings, name=package.name)
        template = None
        if layout.logit_score is not None:  # pairs through the package's chat template
            template = PairTemplate(layout.logit_score, encoder.tokenizer, model=name)
        return TaskHeadsModel(
            info,
            engine_model,
            encoder=encoder,
            labels=labels,
            pooling=layout.pooling,
            normalize=layout.normalize,
            uses_type_ids=uses_type_ids(layout.config),
            hidden_size=int(layout.config.get("hidden_size") or 0),
            sentence=sentence,
            post_pooling=load_post_pooling(package, sentence),
            num_layers=int(layout.config.get("num_hidden_layers") or 0),
            outputs=kinds,
            colbert=codec,
            pair_template=template,
            pair_prompts=layout.pair_prompts,
        )

    def descriptor(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "surfaces": list(self.surfaces),
            "model_types": supported_model_types(),
            "heads": ["sequence", "scores", "token", "pooled", "relevance", "sparse"],
        }


def _rerank_view(layout: Layout, heads: list[HeadInfo], embedding: EmbeddingView | None) -> RerankView | None:
    """The one exit a pair scorer here serves: its last layer, at the width it scores from (the
    embedding's for a bi-encoder, the hidden size for a cross-encoder)."""
    head = next((h for h in heads if "rerank" in SURFACES_OF[h.kind]), None)
    if head is None:
        return None
    hidden = int(layout.config.get("hidden_size") or 0)
    dimension = embedding.dimension if head.kind == POOLED and embedding is not None else hidden
    exit_ = RerankExit(layer=int(layout.config.get("num_hidden_layers") or 0), dimension=dimension)
    return RerankView(exits=[exit_], default=exit_)


def _embedding_view(layout: Layout, engine_model: EngineModel | None, spec: ModelSpec) -> EmbeddingView:
    hidden = int(layout.config["hidden_size"])
    layers = int(layout.config.get("num_hidden_layers") or 0)
    if layout.colbert is not None:  # no pooled vector: one normalised vector per kept token
        return EmbeddingView(
            dimension=layout.colbert.dimension,
            normalized=True,
            pooling="none",
            similarity_fn_name="MaxSim",
            layers=[layers] if layers else [],
            input_types=[pylate.QUERY, pylate.DOCUMENT],
        )
    sentence = layout.sentence
    return EmbeddingView(
        dimension=sentence.dimension(hidden) if sentence else hidden,
        normalized=layout.normalize,
        pooling=layout.pooling or "mean",
        similarity_fn_name=sentence.similarity_fn_name if sentence else None,
        layers=declared_layers(layers, engine_model, has_weights=bool(spec.weight_files)),
    )
