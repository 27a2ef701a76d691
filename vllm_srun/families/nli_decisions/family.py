"""`NliDecisionsFamily`: serves `/v1/decisions` with a Hugging Face NLI cross-encoder.

A package is recognised by its config.json (and whether it ships an ONNX graph): a
`*ForSequenceClassification` class the architecture table serves (or any model type with an
ONNX graph), and an `id2label` that names entailment and contradiction (case-insensitive;
neutral optional). The family loads config.json,
tokenizer.json, tokenizer_config.json when present, the safetensors weights and an ONNX graph
when present, and hashes exactly those files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_srun.errors import PackageError
from vllm_srun.families.nli_decisions.model import NliDecisionModel
from vllm_srun.families.nli_decisions.presets import PRESETS
from vllm_srun.plugins.architectures import served_kind, standard_config, supported_model_types, uses_type_ids
from vllm_srun.plugins.base import (
    EngineModel,
    HeadInfo,
    ModelFamily,
    ModelInfo,
    ModelSpec,
    Verification,
)
from vllm_srun.plugins.package import (
    ONNX_PATHS,
    ModelPackage,
    checkpoint_max_tokens,
    checkpoint_spec,
    combined_sha256,
)


@dataclass(frozen=True, kw_only=True)
class NliLayout:
    """What the family reads of a package; paths are relative to its root."""

    config: dict[str, Any]
    labels: list[str]
    entailment: int
    contradiction: int
    weight_files: tuple[str, ...]
    onnx: str | None
    tokenizer_config: str | None

    def files(self) -> list[str]:
        optional = [f for f in (self.tokenizer_config, self.onnx) if f is not None]
        return ["config.json", "tokenizer.json", *self.weight_files, *optional]


def nli_labels(config: Any, *, has_onnx: bool = False) -> tuple[list[str], int, int] | None:
    """(labels, entailment index, contradiction index) when `config` is an NLI classifier."""
    if not isinstance(config, dict):
        return None
    found = served_kind(config, has_onnx=has_onnx)
    if found is None or found[0] != "sequence":
        return None
    id2label = config.get("id2label")
    if not isinstance(id2label, dict) or not id2label:
        return None
    try:
        named = {int(k): str(v) for k, v in id2label.items()}
    except ValueError:
        return None
    labels = [named.get(i, f"LABEL_{i}") for i in range(max(named) + 1)]
    lowered = [label.lower() for label in labels]
    if "entailment" not in lowered or "contradiction" not in lowered:
        return None
    return labels, lowered.index("entailment"), lowered.index("contradiction")


def read_layout(package: ModelPackage) -> NliLayout:
    config = package.read_json("config.json")
    found = nli_labels(config, has_onnx=_has_onnx(package))
    if found is None:
        raise PackageError(
            f"{package.name!r} is not an NLI cross-encoder: needs a *ForSequenceClassification of a "
            f"model type the runtime serves ({', '.join(supported_model_types())}, or any with "
            "onnx/model.onnx) and id2label naming entailment and contradiction"
        )
    config = standard_config(config)
    if not package.exists("tokenizer.json"):
        raise PackageError(f"{package.name!r} has no tokenizer.json (a fast tokenizer is required)")
    onnx = next((p for p in ONNX_PATHS if package.exists(p)), None)
    weights = tuple(sorted(p.name for p in package.root.iterdir() if p.name.endswith(".safetensors")))
    for name in weights:
        package.path(name)  # applies the package's symlink rule to every weight file
    if not weights and onnx is None:
        raise PackageError(f"{package.name!r} has no weights (*.safetensors or onnx/model.onnx)")
    labels, entailment, contradiction = found
    return NliLayout(
        config=config,
        labels=labels,
        entailment=entailment,
        contradiction=contradiction,
        weight_files=weights,
        onnx=onnx,
        tokenizer_config="tokenizer_config.json" if package.exists("tokenizer_config.json") else None,
    )


def _has_onnx(package: ModelPackage) -> bool:
    return any(package.exists(p) for p in ONNX_PATHS)


class NliDecisionsFamily(ModelFamily):
    """NLI cross-encoders (any architecture the table serves) answering `/v1/decisions` questions."""

    name = "nli_decisions"
    surfaces = ("decisions",)
    looks_for = (
        "config.json of a sequence classifier (as task_heads reads it) whose id2label names an "
        "entailment and a contradiction label"
    )
    fixture_writer = "vllm_srun.testing.nli_fixtures:write_fixture"
    # An NLI classifier is also a sequence classifier to task_heads; as one, it serves decisions.
    specificity = 10

    def detect(self, package: ModelPackage) -> bool:
        if not package.exists("config.json"):
            return False
        try:
            return nli_labels(package.read_json("config.json"), has_onnx=_has_onnx(package)) is not None
        except PackageError:
            return False

    def verify(self, package: ModelPackage) -> Verification:
        layout = read_layout(package)
        files = package.digests(layout.files())
        return Verification(
            model_sha256=combined_sha256(files),
            files=files,
            max_tokens=checkpoint_max_tokens(package, layout.config, layout.tokenizer_config),
        )

    def describe(self, package: ModelPackage) -> ModelSpec:
        layout = read_layout(package)
        return checkpoint_spec(self.name, package, layout.config, layout.weight_files, layout.onnx)

    def load(
        self,
        package: ModelPackage,
        spec: ModelSpec,
        engine_model: EngineModel | None,
        *,
        name: str,
        verification: Verification,
        numerics: str,
    ) -> NliDecisionModel:
        layout = read_layout(package)
        info = ModelInfo(
            name=name,
            family=self.name,
            surfaces=list(self.surfaces),
            model_sha256=verification.model_sha256,
            numerics=numerics,
            heads=[HeadInfo(name="nli", kind="nli", labels=layout.labels)],
            max_tokens=verification.max_tokens
            or checkpoint_max_tokens(package, layout.config, layout.tokenizer_config),
            licence=verification.licence,
        )
        return NliDecisionModel(
            info,
            engine_model,
            tokenizer_json=package.read_bytes("tokenizer.json").decode(),
            entailment=layout.entailment,
            contradiction=layout.contradiction,
            uses_type_ids=uses_type_ids(layout.config),
        )

    def descriptor(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "surfaces": list(self.surfaces),
            "model_types": supported_model_types(),
            "question_types": list(NliDecisionModel.question_types),
            "presets": list(PRESETS),
        }
