"""The native engine's architecture registry: architecture name -> "module:Class".

Classes are imported when first used, so registering costs nothing. A plugin adds its own
with `register_model`; an unknown name fails with the list of known ones.
"""

from __future__ import annotations

import importlib
from typing import Any

from vllm_srun.errors import ConfigError

# Built-in architectures of the native engine; plugins add theirs with `register_model`.
_NATIVE = "vllm_srun.engines.native"
_MODELS: dict[str, str] = {
    "BertModel": f"{_NATIVE}.bert:BertModel",
    "BertForSequenceClassification": f"{_NATIVE}.bert:BertForSequenceClassification",
    "BertForTokenClassification": f"{_NATIVE}.bert:BertForTokenClassification",
    "ModernBertModel": f"{_NATIVE}.modernbert:ModernBertModel",
    "ModernBertForSequenceClassification": f"{_NATIVE}.modernbert:ModernBertForSequenceClassification",
    "ModernBertForTokenClassification": f"{_NATIVE}.modernbert:ModernBertForTokenClassification",
}


def register_model(architecture: str, target: str) -> None:
    """Map `architecture` (as in config.json's `architectures`) to a "module:Class" string."""
    if ":" not in target:
        raise ValueError(f"model target {target!r} must be 'module:Class'")
    _MODELS[architecture] = target


def known_architectures() -> list[str]:
    return sorted(_MODELS)


def resolve_model(architecture: str) -> Any:
    """The class registered for `architecture`, imported now."""
    target = _MODELS.get(architecture)
    if target is None:
        known = ", ".join(known_architectures()) or "none"
        raise ConfigError(f"unknown architecture {architecture!r} (known: {known})")
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attr)
