"""The architecture table (longer than 500 lines: row types, built-in rows and registry are one table).

A row (`Architecture`) names the `model_type`s a network covers, the class that runs it
("module:Class", imported when first used), the head of each Transformers class, its fast paths
and config spellings, and how to write a tiny fixture of it. The engine, the families,
`register_model` and the fixture writer all read this table. Data only: no torch, no engine.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vllm_srun.errors import ConfigError

# What a class's head makes of a package: a bare encoder ("model": embeddings with a
# sentence-transformers configuration), a sequence classifier or a token tagger.
KINDS = ("model", "sequence", "token")


@dataclass(frozen=True, kw_only=True)
class Fixture:
    """How `vllm-srun fixture` writes a tiny random package of one flavour of an architecture:
    the Transformers config class, the class-name prefix, the tokenizer kind the fixture writer
    builds (wordpiece, bytelevel, unigram) and config settings beyond the shared tiny sizes."""

    config_class: str
    class_prefix: str
    tokenizer: str
    settings: Mapping[str, Any] = field(default_factory=dict)
    # The tokenizer's special ids the config names: pad, bos, eos, cls, sep.
    special_ids: tuple[str, ...] = ("pad",)
    # Keys written into config.json after Transformers saves it (Hub spellings it rewrites).
    hub_config: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Architecture:
    """One network, declared once (see the module docstring)."""

    name: str
    model_types: tuple[str, ...]
    target: str  # "module:Class" of the native implementation
    classes: Mapping[str, tuple[str, str | None]]  # Transformers class -> (kind, head name)
    type_ids: bool = False  # reads token type ids (when config.json's type_vocab_size > 1)
    fast_paths: tuple[str, ...] = ("dense", "onnx")  # the native engine's small-batch paths
    config_keys: Mapping[str, str] = field(default_factory=dict)  # standard key -> this config's
    # Positions start at pad_token_id + 1 (RoBERTa's family): the table holds that many fewer.
    position_offset: bool = False
    fixtures: Mapping[str, Fixture] = field(default_factory=dict)  # flavour -> how to write one
    # The output head (engines/native/outputs.py) that reads the row's *ForMaskedLM head as
    # SPLADE: such a package without modules.json is a sparse embedder. None: not served so.
    sparse_head: str | None = None

    def descriptor(self) -> dict[str, Any]:
        """What /v1/models, `vllm-srun plugins` and `models --architectures` show of the row."""
        return {
            "name": self.name,
            "model_types": list(self.model_types),
            "classes": {cls: kind for cls, (kind, _) in sorted(self.classes.items())},
            "type_ids": self.type_ids,
            "fast_paths": list(self.fast_paths),
        }

    def kind_of(self, architecture: str) -> str | None:
        entry = self.classes.get(architecture)
        return entry[0] if entry else None

    def head_of(self, architecture: str) -> str | None:
        entry = self.classes.get(architecture)
        return entry[1] if entry else None

    def uses_type_ids(self, config: Mapping[str, Any]) -> bool:
        """Whether token type ids reach the model: only where it has more than one type."""
        return self.type_ids and int(config.get("type_vocab_size", 2) or 0) > 1

    def standard_config(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """`config` with the standard keys filled from this architecture's spelling of them."""
        out = dict(config)
        for standard, own in self.config_keys.items():
            if standard not in out and own in out:
                out[standard] = out[own]
        if self.position_offset and "max_position_embeddings" in out:
            offset = int(out.get("pad_token_id") or 0) + 1
            out["usable_positions"] = int(out["max_position_embeddings"]) - offset
        return out


def encoder_classes(
    prefixes: tuple[str, ...], sequence: str, token: str = "token", *, extra: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The class names an encoder has, with their heads: *Model, *ForMaskedLM and `extra`
    (e.g. ForPreTraining) as bare encoders — the sentence-transformers packages that name
    them are embedders, and the LM head is ignored — and the `sequence` and `token` heads."""
    bare = ("Model", "ForMaskedLM", *extra)
    heads: dict[str, tuple[str, str | None]] = {suffix: ("model", None) for suffix in bare}
    heads["ForSequenceClassification"] = ("sequence", sequence)
    heads["ForTokenClassification"] = ("token", token)
    return {prefix + suffix: entry for prefix in prefixes for suffix, entry in heads.items()}


# The built-in rows: one per network the native engine runs (a plugin ships its row through
# the `vllm_srun.architectures` entry point instead).
_NATIVE = "vllm_srun.engines.native"


BUILTIN: tuple[Architecture, ...] = (
    Architecture(
        name="bert",
        model_types=("bert",),
        target=f"{_NATIVE}.bert:Bert",
        classes=encoder_classes(("Bert",), "pooler", extra=("ForPreTraining",)),
        type_ids=True,
        fixtures={"bert": Fixture(config_class="BertConfig", class_prefix="Bert", tokenizer="wordpiece")},
        sparse_head="bert_mlm",
    ),
    Architecture(
        name="modernbert",
        model_types=("modernbert",),
        target=f"{_NATIVE}.modernbert:ModernBert",
        classes=encoder_classes(("ModernBert",), "modernbert", "modernbert_token"),
        fast_paths=("dense",),
        fixtures={
            flavour: Fixture(
                config_class="ModernBertConfig",
                class_prefix="ModernBert",
                tokenizer=tokenizer,
                # The Hub spelling of the layer pattern, which Transformers 5 turns into layer_types.
                settings={"global_attn_every_n_layers": 2, "local_attention": 8},
                special_ids=("pad", "bos", "eos", "cls", "sep"),
                hub_config={
                    "global_attn_every_n_layers": 2,
                    "global_rope_theta": 160000.0,
                    "local_rope_theta": 10000.0,
                },
            )
            for flavour, tokenizer in (("modernbert", "bytelevel"), ("mmbert", "unigram"))
        },
    ),
    Architecture(
        name="roberta",
        model_types=("roberta", "xlm-roberta", "camembert"),
        target=f"{_NATIVE}.roberta:Roberta",
        classes=encoder_classes(("Roberta", "XLMRoberta", "Camembert"), "dense"),
        position_offset=True,
        fixtures={
            flavour: Fixture(
                config_class=f"{prefix}Config",
                class_prefix=prefix,
                tokenizer=tokenizer,
                # One token type, as the released checkpoints have (the config classes default to 2).
                settings={"type_vocab_size": 1},
                special_ids=("pad", "bos", "eos"),
            )
            for flavour, prefix, tokenizer in (
                ("roberta", "Roberta", "bytelevel"),
                ("xlm-roberta", "XLMRoberta", "unigram"),
                ("camembert", "Camembert", "unigram"),
            )
        },
    ),
    Architecture(
        name="electra",
        model_types=("electra",),
        target=f"{_NATIVE}.electra:Electra",
        classes=encoder_classes(("Electra",), "dense_gelu", extra=("ForPreTraining",)),
        type_ids=True,
        fixtures={
            # embedding_size below hidden_size, as the released ELECTRA-small has: embeddings_project runs.
            "electra": Fixture(
                config_class="ElectraConfig",
                class_prefix="Electra",
                tokenizer="wordpiece",
                settings={"embedding_size": 16},
            )
        },
    ),
    Architecture(
        name="distilbert",
        model_types=("distilbert",),
        target=f"{_NATIVE}.distilbert:DistilBert",
        classes=encoder_classes(("DistilBert",), "pre_classifier"),
        sparse_head="distilbert_mlm",
        config_keys={
            "hidden_size": "dim",
            "num_hidden_layers": "n_layers",
            "num_attention_heads": "n_heads",
            "intermediate_size": "hidden_dim",
        },
        fixtures={
            # DistilBertConfig maps hidden_size/num_hidden_layers/num_attention_heads onto its own
            # names but not intermediate_size: hidden_dim is DistilBERT's own spelling of it.
            "distilbert": Fixture(
                config_class="DistilBertConfig",
                class_prefix="DistilBert",
                tokenizer="wordpiece",
                settings={"hidden_dim": 64},
            )
        },
    ),
    Architecture(
        name="deberta-v2",
        model_types=("deberta-v2",),
        target=f"{_NATIVE}.deberta_v2:DebertaV2",
        classes=encoder_classes(("DebertaV2",), "context_pooler"),
        type_ids=True,  # v2 has two token types; v3's type_vocab_size 0 sends none
        fast_paths=("dense",),  # the relative bias is built from the block width: no ONNX export
        fixtures={
            # DeBERTa-v3: no absolute positions, no token types, log buckets (8 < the parity
            # rows' 40 tokens) over max_relative_positions 16, shared keys, normalised table.
            "deberta-v3": Fixture(
                config_class="DebertaV2Config",
                class_prefix="DebertaV2",
                tokenizer="unigram",
                settings={
                    "type_vocab_size": 0,
                    "position_biased_input": False,
                    "relative_attention": True,
                    "pos_att_type": ["p2c", "c2p"],
                    "share_att_key": True,
                    "position_buckets": 8,
                    "max_relative_positions": 16,
                    "norm_rel_ebd": "layer_norm",
                },
            ),
            # DeBERTa-v2: absolute positions too, two token types, unbucketed distances clamped
            # at 16, separate position projections, and a narrower embedding through embed_proj.
            "deberta-v2": Fixture(
                config_class="DebertaV2Config",
                class_prefix="DebertaV2",
                tokenizer="wordpiece",
                settings={
                    "type_vocab_size": 2,
                    "position_biased_input": True,
                    "relative_attention": True,
                    "pos_att_type": ["c2p", "p2c"],
                    "share_att_key": False,
                    "max_relative_positions": 16,
                    "embedding_size": 16,
                },
            ),
        },
    ),
    Architecture(
        name="mpnet",
        model_types=("mpnet",),
        target=f"{_NATIVE}.mpnet:MPNet",
        classes=encoder_classes(("MPNet",), "dense"),
        fast_paths=("dense",),  # relative-position bias: no fixed-shape graph to trace
        position_offset=True,
        fixtures={
            "mpnet": Fixture(
                config_class="MPNetConfig",
                class_prefix="MPNet",
                tokenizer="wordpiece",
                # Transformers' MPNet pads at index 1 whatever the tokenizer says (real MPNet
                # vocabularies put <pad> there): the config says so, and its table holds
                # 2 + the fixtures' positions.
                settings={"pad_token_id": 1, "max_position_embeddings": 130},
                special_ids=("pad", "bos", "eos"),
            )
        },
    ),
    Architecture(
        name="qwen3",
        model_types=("qwen3",),
        target=f"{_NATIVE}.qwen3:Qwen3",
        # Decoders served as encoders: Qwen3-Embedding (a bare Qwen3Model with last-token
        # pooling), one-label rerankers, token taggers, and causal LMs read as yes/no
        # rerankers, which the family serves only as sentence-transformers LogitScore packages
        # (`CONVERT` otherwise).
        classes={
            "Qwen3Model": ("model", None),
            "Qwen3ForSequenceClassification": ("sequence", "last_token_score"),
            "Qwen3ForTokenClassification": ("token", "score_token"),
            "Qwen3ForCausalLM": ("sequence", "logit_score"),
        },
        fast_paths=("dense",),  # rotary
        fixtures={
            # Heads x head_dim (64) differs from hidden_size (32), as in Qwen3-0.6B (16 x 128
            # against 1024); a non-default theta, so a reader that ignores it fails. "qwen3-eot-pad"
            # pads with the <|endoftext|> its tokenizer appends, as Qwen's tokenizers do: the
            # reference classifier then scores the token before it.
            flavour: Fixture(
                config_class="Qwen3Config",
                class_prefix="Qwen3",
                tokenizer=tokenizer,
                settings={"num_key_value_heads": 2, "head_dim": 16, "rope_theta": 1000.0},
                special_ids=("pad", "bos", "eos"),
                hub_config={"rope_theta": 1000.0, "rope_scaling": None},
            )
            for flavour, tokenizer in (("qwen3", "bytelevel_eot"), ("qwen3-eot-pad", "bytelevel_eot_pad"))
        },
    ),
    Architecture(
        name="nomic-bert",
        model_types=("nomic_bert",),
        target=f"{_NATIVE}.nomic_bert:NomicBert",
        classes=encoder_classes(("NomicBert",), "pooler"),
        type_ids=True,
        fast_paths=("dense",),  # rotary: no dynamic-shape ONNX trace
        # The Hub's nomic-embed-text configs keep the remote code's GPT-2 spellings.
        config_keys={
            "hidden_size": "n_embd",
            "num_hidden_layers": "n_layer",
            "num_attention_heads": "n_head",
            "intermediate_size": "n_inner",
            "max_position_embeddings": "n_positions",
        },
        fixtures={
            "nomic-bert": Fixture(
                config_class="NomicBertConfig",
                class_prefix="NomicBert",
                tokenizer="wordpiece",
                # A theta other than the class default, so the one read from config.json counts.
                settings={"rope_parameters": {"rope_type": "default", "rope_theta": 500.0}},
            )
        },
    ),
    Architecture(
        name="gte",
        model_types=("gte",),
        target=f"{_NATIVE}.gte:Gte",
        classes=encoder_classes(("Gte",), "pooler"),
        type_ids=True,  # gte-large-en-v1.5 has two token types; others one or none
        fast_paths=("dense",),  # rotary: no dynamic-shape ONNX trace
        fixtures={
            "gte": Fixture(
                config_class="GteConfig",
                class_prefix="Gte",
                tokenizer="wordpiece",
                settings={"rope_parameters": {"rope_type": "default", "rope_theta": 20000.0}},
            )
        },
    ),
)


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
