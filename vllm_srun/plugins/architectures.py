"""The architecture table: every architecture the runtime knows, declared once.

One `Architecture` row per network says which `model_type`s it covers, the class that runs it
(a "module:Class" string, imported when first used), the head each Transformers class name
carries, whether it reads token type ids, which fast paths its engine offers, how its
config.json spells the standard sizes, and how to write a tiny fixture of it. The native
engine's registry, the families' detection, `register_model`, the fixture writer and the
parity tests all read this table; nothing else keeps a list of model types.

The row type is in `architecture.py`, the built-in rows in `builtin_architectures.py`; this
module is the registry that everything reads. The table is data, not code: it imports neither torch nor an engine, so an app replica (which
plans and finishes without weights) and a family read it as the engine does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vllm_srun.errors import ConfigError
from vllm_srun.plugins.architecture import KINDS, Architecture, Fixture
from vllm_srun.plugins.builtin_architectures import BUILTIN

# Re-exported: a plugin declares its row with these.
__all__ = ["BUILTIN", "KINDS", "Architecture", "Fixture"]


_ARCHITECTURES: dict[str, Architecture] = {}
# Transformers class name -> (architecture row name, "module:Class") for every known class.
_MODELS: dict[str, tuple[str, str]] = {}


def register_architecture(arch: Architecture) -> None:
    """Add (or replace) a table row: its classes become known to the engine and the families."""
    for kind, _ in arch.classes.values():
        if kind not in KINDS:
            raise ValueError(f"architecture {arch.name!r}: kind {kind!r} is not one of {KINDS}")
    if ":" not in arch.target:
        raise ValueError(f"model target {arch.target!r} must be 'module:Class'")
    _ARCHITECTURES[arch.name] = arch
    for cls in arch.classes:
        _MODELS[cls] = (arch.name, arch.target)


for _row in BUILTIN:
    register_architecture(_row)


def register_model(
    architecture: str, target: str, *, model_type: str | None = None, type_ids: bool = False
) -> None:
    """Map `architecture` (as in config.json's `architectures`) to a "module:Class" string.

    With `model_type`, the class also becomes a row of its own, so the families serve packages
    of that (new) model type: its kind follows the class name's suffix (`*ForSequenceClassification`,
    `*ForTokenClassification`, else a bare encoder). The class is built as
    `cls(config, head=...)` with the head the suffix implies ("pooler" or "token"), so a
    subclass of a built-in architecture keeps its heads.
    """
    row = architecture_of(architecture)
    if model_type is None and row is not None:  # a known class, run by another implementation
        register_architecture(_with_target(row, architecture, target))
        return
    register_architecture(
        Architecture(
            name=architecture,
            model_types=(model_type,) if model_type else (),
            target=target,
            classes={architecture: _suffix_kind(architecture)},
            type_ids=type_ids,
            fast_paths=("dense",),
        )
    )


def _with_target(row: Architecture, architecture: str, target: str) -> Architecture:
    """A row of its own for one class of `row` served by another target."""
    return Architecture(
        name=architecture,
        model_types=row.model_types,
        target=target,
        classes={architecture: row.classes[architecture]},
        type_ids=row.type_ids,
        fast_paths=row.fast_paths,
        config_keys=row.config_keys,
    )


def _suffix_kind(architecture: str) -> tuple[str, str | None]:
    if architecture.endswith("ForSequenceClassification"):
        return ("sequence", "pooler")
    if architecture.endswith("ForTokenClassification"):
        return ("token", "token")
    return ("model", None)


def architectures() -> list[Architecture]:
    """Every row, built-in and registered, in registration order."""
    return list(_ARCHITECTURES.values())


def known_architectures() -> list[str]:
    return sorted(_MODELS)


def supported_model_types() -> list[str]:
    return sorted({t for arch in _ARCHITECTURES.values() for t in arch.model_types})


def architecture_of(architecture: str) -> Architecture | None:
    """The row that serves the Transformers class `architecture`, None when none does."""
    known = _MODELS.get(architecture)
    return _ARCHITECTURES.get(known[0]) if known else None


def declared(config: Mapping[str, Any]) -> tuple[Architecture, str] | None:
    """The row and class name that serve a package's config.json, None when none does: its
    first `architectures` entry must be a class of a row that covers its `model_type`."""
    names = config.get("architectures") or []
    if not names or not isinstance(names[0], str):
        return None
    arch = architecture_of(names[0])
    if arch is None or config.get("model_type") not in arch.model_types:
        return None
    return arch, names[0]


def served_kind(config: Mapping[str, Any], *, has_onnx: bool) -> tuple[str, Architecture | None] | None:
    """The kind ("model", "sequence", "token") a package's config declares, with the row that
    runs it natively; a package of a model type no row covers still serves from its ONNX graph
    (row None), its kind read from the class name's suffix. None when neither applies."""
    found = declared(config)
    if found is not None:
        arch, cls = found
        kind = arch.kind_of(cls)
        assert kind is not None
        return kind, arch
    names = config.get("architectures") or []
    if has_onnx and names and isinstance(names[0], str):
        return _suffix_kind(names[0])[0], None
    return None


def uses_type_ids(config: Mapping[str, Any]) -> bool:
    """Whether a package's inputs carry token type ids: as its row says, and for a model type
    no row covers (served from ONNX) where its config has more than one type (the onnxruntime
    engine then sends them exactly when the graph takes them)."""
    found = declared(config)
    if found is not None:
        return found[0].uses_type_ids(config)
    return int(config.get("type_vocab_size", 0) or 0) > 1


def standard_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """`config` with the standard size keys filled as its row spells them."""
    found = declared(config)
    return found[0].standard_config(config) if found is not None else dict(config)


def resolve_model(architecture: str) -> Any:
    """The class registered for `architecture`, imported now."""
    import importlib

    known = _MODELS.get(architecture)
    if known is None:
        raise ConfigError(f"unknown architecture {architecture!r} (known: {', '.join(known_architectures())})")
    module_name, _, attr = known[1].partition(":")
    return getattr(importlib.import_module(module_name), attr)


# The config key under which a family hands a LogitScore head (engines/native/heads.py) the
# package's [true token id, false token id or None]: a causal LM read as a yes/no reranker.
LOGIT_SCORE_IDS = "logit_score_token_ids"

# Classes of a served model type that serve only in a form the family recognises, with what
# to tell a package in any other form.
CONVERT = {
    "Qwen3ForCausalLM": (
        "Qwen3ForCausalLM is a causal language model; the runtime serves no LM head. A reranker "
        "of this form (Qwen3-Reranker, which scores by the 'yes' and 'no' logits of its last "
        "token) serves as shipped when it is a sentence-transformers CrossEncoder package: "
        "modules.json with the Transformer (transformer_task 'text-generation') then a LogitScore "
        "module (1_LogitScore/config.json naming true_token_id and false_token_id), and a chat "
        "template that renders the query and document roles. Otherwise convert it to a one-label "
        "Qwen3ForSequenceClassification: keep the model.* tensors, write score.weight = "
        "lm_head.weight[id of 'yes'] - lm_head.weight[id of 'no'] (shape [1, hidden_size]), and "
        "set architectures to ['Qwen3ForSequenceClassification'] and num_labels to 1; its sigmoid "
        "is the reranker's softmax probability of 'yes'. Format each pair with the reranker's "
        "prompt template"
    ),
}


def converts(config: Mapping[str, Any]) -> bool:
    """Whether config.json's class serves only in a form a family recognises (`CONVERT`): a
    package no family took is then told the forms, whatever the table says of the class."""
    found = config.get("architectures") or []
    return bool(found) and isinstance(found[0], str) and found[0] in CONVERT


def refusal(config: Mapping[str, Any]) -> str:
    """What to tell a user whose package no row serves: what was found, what is supported,
    and the two ways out."""
    found = config.get("architectures") or []
    if found and isinstance(found[0], str) and found[0] in CONVERT:
        return CONVERT[found[0]]
    return (
        f"model_type {config.get('model_type')!r} with architectures {list(found)} is not one the "
        f"native engine knows (model types: {', '.join(supported_model_types())}; see "
        "`vllm-srun models --architectures`). Two ways out: export the model to onnx/model.onnx "
        "(it then serves on onnxruntime whatever its model_type), or install a plugin that "
        "registers the architecture with vllm_srun.plugins.architectures.register_model"
    )
