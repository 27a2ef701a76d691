"""sentence-transformers SparseEncoder packages (SPLADE, as naver/splade-v3 ships it), read the
way `SparseEncoder` reads them.

modules.json must hold the masked-LM transformer and a `SpladePooling` with max pooling and relu
(what the engine's masked-LM output head computes); another setting is refused, naming it.
`max_seq_length` and `do_lower_case` apply as for a dense package; a `default_prompt_name` is
refused (texts are encoded as given).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_srun.errors import PackageError
from vllm_srun.plugins.package import ModelPackage

MODULES = "modules.json"
SENTENCE_BERT_CONFIG = "sentence_bert_config.json"
ST_CONFIG = "config_sentence_transformers.json"
_TRANSFORMERS = ("MLMTransformer", "Transformer")
_POOLING = "SpladePooling"
_SERVED = {"pooling_strategy": "max", "activation_function": "relu"}


@dataclass(frozen=True)
class SparseEncoderConfig:
    """What the family reads of a SparseEncoder package; `files` are the ones it hashes."""

    files: tuple[str, ...]
    max_seq_length: int | None = None
    do_lower_case: bool = False


def _modules(package: ModelPackage) -> list[dict[str, Any]] | None:
    try:
        modules = package.read_json(MODULES)
    except PackageError:
        return None
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        return None
    return modules


def _kind(module: dict[str, Any]) -> str:
    return str(module.get("type", "")).rsplit(".", 1)[-1]


def is_sparse_encoder(package: ModelPackage) -> bool:
    """Whether the package's modules.json is a SparseEncoder's (it has a SpladePooling)."""
    modules = _modules(package)
    return modules is not None and any(_kind(m) == _POOLING for m in modules)


def _object(package: ModelPackage, relative: str) -> dict[str, Any]:
    data = package.read_json(relative)
    if not isinstance(data, dict):
        raise PackageError(f"{relative} in {package.name!r} is not a JSON object")
    return data


def read_sparse_encoder(package: ModelPackage) -> SparseEncoderConfig:
    """The package's SparseEncoder configuration; PackageError names what cannot be served."""
    modules = _modules(package) or []
    kinds = [_kind(m) for m in modules]
    if len(kinds) != 2 or kinds[0] not in _TRANSFORMERS or kinds[1] != _POOLING:
        raise PackageError(
            f"{MODULES} in {package.name!r} has modules {kinds}; a sparse encoder is served as "
            f"[MLMTransformer, {_POOLING}] only"
        )
    pooling = f"{modules[1].get('path') or '1_SpladePooling'}/config.json"
    settings = _object(package, pooling)
    for key, served in _SERVED.items():
        if settings.get(key, served) != served:
            raise PackageError(
                f"{pooling} in {package.name!r}: {key} {settings[key]!r} is not served (only {served!r})"
            )
    files = [MODULES, pooling]
    data: dict[str, Any] = {}
    if package.exists(SENTENCE_BERT_CONFIG):
        files.append(SENTENCE_BERT_CONFIG)
        data = _object(package, SENTENCE_BERT_CONFIG)
    if kinds[0] == "Transformer" and data.get("transformer_task") != "fill-mask":
        raise PackageError(
            f"{SENTENCE_BERT_CONFIG} in {package.name!r}: a Transformer before {_POOLING} must have "
            "transformer_task 'fill-mask'"
        )
    if package.exists(ST_CONFIG):
        files.append(ST_CONFIG)
        default = _object(package, ST_CONFIG).get("default_prompt_name")
        if default:
            raise PackageError(
                f"{ST_CONFIG} in {package.name!r}: default_prompt_name {default!r} is not served for a "
                "sparse encoder (its texts are encoded as given)"
            )
    limit = data.get("max_seq_length")
    if limit is not None and (not isinstance(limit, int) or limit < 2):
        raise PackageError(f"{SENTENCE_BERT_CONFIG} in {package.name!r}: max_seq_length {limit!r}")
    lowercase = bool(data.get("do_lower_case", False))
    return SparseEncoderConfig(files=tuple(files), max_seq_length=limit, do_lower_case=lowercase)
