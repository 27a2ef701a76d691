"""What one row of the architecture table declares (see `vllm_srun.plugins.architectures`).

An `Architecture` names the `model_type`s a network covers, the class that runs it (a
"module:Class" string, imported when first used), the head each Transformers class carries,
whether it reads token type ids, which fast paths its engine offers, how its config.json spells
the standard sizes, and how to write a tiny fixture of it. Data only: no torch, no engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

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
