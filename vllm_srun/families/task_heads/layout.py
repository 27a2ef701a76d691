"""Which files of a package the family loads, and what they say.

Everything the family reads is named here, so `verify` hashes exactly the files `load` and the
engines use: config.json, tokenizer.json, tokenizer_config.json, the safetensors weights, the
ONNX graph, and for sentence-transformers embedders modules.json and the pooling config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_srun import defaults
from vllm_srun.errors import PackageError
from vllm_srun.plugins.package import ModelPackage, checkpoint_max_tokens

MODEL_TYPES = ("bert", "modernbert")
ONNX_PATHS = ("onnx/model.onnx", "model.onnx")

# sentence-transformers modules the family can reproduce; any other module changes the output.
_ST_MODULES = {"Transformer", "Pooling", "Normalize"}
_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_lasttoken": "last",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_weightedmean_tokens": "weightedmean",
}
_POOLING_NAMES = {"cls": "cls", "mean": "mean", "lasttoken": "last", "last": "last"}


@dataclass(frozen=True, kw_only=True)
class Layout:
    """A package as the family sees it. Paths are relative to the package root."""

    config: dict[str, Any]
    architecture: str
    kind: str  # "sequence", "token" or "embedding"
    weight_files: tuple[str, ...]
    onnx: str | None
    tokenizer_config: str | None
    modules: str | None = None
    pooling_config: str | None = None
    pooling: str | None = None
    normalize: bool = False
    max_tokens: int = defaults.FALLBACK_MAX_TOKENS

    def files(self) -> list[str]:
        """Every file `load` or an engine reads, in a stable order."""
        names = ["config.json", "tokenizer.json", *self.weight_files]
        for optional in (self.tokenizer_config, self.modules, self.pooling_config, self.onnx):
            if optional is not None:
                names.append(optional)
        return names


def kind_of(config: dict[str, Any], package: ModelPackage) -> str | None:
    """The head kind a config declares, or None when the family does not serve it."""
    if config.get("model_type") not in MODEL_TYPES:
        return None
    architectures = config.get("architectures") or []
    if not architectures or not isinstance(architectures[0], str):
        return None
    arch = architectures[0]
    if arch.endswith("ForSequenceClassification"):
        return "sequence"
    if arch.endswith("ForTokenClassification"):
        return "token"
    if arch.endswith("Model") and package.exists("modules.json"):
        return "embedding"
    return None


def read_layout(package: ModelPackage) -> Layout:
    """The layout of `package`; PackageError names the file or setting that cannot be served."""
    config = package.read_json("config.json")
    if not isinstance(config, dict):
        raise PackageError(f"config.json in {package.name!r} is not a JSON object")
    kind = kind_of(config, package)
    if kind is None:
        raise PackageError(
            f"{package.name!r} is not a task_heads model: needs model_type in {MODEL_TYPES} and an "
            "architecture *ForSequenceClassification, *ForTokenClassification or *Model with modules.json"
        )
    if not package.exists("tokenizer.json"):
        raise PackageError(f"{package.name!r} has no tokenizer.json (a fast tokenizer is required)")
    onnx = next((p for p in ONNX_PATHS if package.exists(p)), None)
    weights = _weight_files(package, has_onnx=onnx is not None)
    tokenizer_config = "tokenizer_config.json" if package.exists("tokenizer_config.json") else None
    layout: dict[str, Any] = {}
    if kind == "embedding":
        layout = _sentence_transformers(package)
    return Layout(
        config=config,
        architecture=config["architectures"][0],
        kind=kind,
        weight_files=weights,
        onnx=onnx,
        tokenizer_config=tokenizer_config,
        max_tokens=checkpoint_max_tokens(package, config, tokenizer_config),
        **layout,
    )


def _weight_files(package: ModelPackage, *, has_onnx: bool) -> tuple[str, ...]:
    names = sorted(p.name for p in package.root.iterdir() if p.name.endswith(".safetensors"))
    for name in names:
        package.path(name)  # applies the symlink rule to every weight file
    if names or has_onnx:
        return tuple(names)
    if (package.root / "pytorch_model.bin").exists():
        raise PackageError(
            f"{package.name!r} has only pytorch_model.bin, a pickled checkpoint the runtime does not "
            "load; convert it to model.safetensors (safetensors.torch.save_file) or add onnx/model.onnx"
        )
    raise PackageError(f"{package.name!r} has no weights (*.safetensors or onnx/model.onnx)")


def _sentence_transformers(package: ModelPackage) -> dict[str, Any]:
    modules = package.read_json("modules.json")
    if not isinstance(modules, list):
        raise PackageError(f"modules.json in {package.name!r} is not a list")
    pooling_path: str | None = None
    normalize = False
    for module in modules:
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        if kind not in _ST_MODULES:
            raise PackageError(
                f"modules.json in {package.name!r} has module {module.get('type')!r}; the family "
                f"reproduces only {sorted(_ST_MODULES)}"
            )
        if kind == "Pooling":
            pooling_path = f"{module.get('path') or '1_Pooling'}/config.json"
        normalize = normalize or kind == "Normalize"
    if pooling_path is None:
        raise PackageError(f"modules.json in {package.name!r} has no Pooling module")
    return {
        "modules": "modules.json",
        "pooling_config": pooling_path,
        "pooling": _pooling_mode(package, pooling_path),
        "normalize": normalize,
    }


def _pooling_mode(package: ModelPackage, relative: str) -> str:
    data = package.read_json(relative)
    mode = data.get("pooling_mode")
    modes = (
        {mode} if isinstance(mode, str) else {name for key, name in _POOLING_KEYS.items() if data.get(key)}
    )
    if len(modes) != 1 or next(iter(modes)) not in _POOLING_NAMES:
        raise PackageError(
            f"{relative} in {package.name!r} asks for pooling {sorted(modes)}; supported: exactly one "
            "of cls, mean, lasttoken"
        )
    return _POOLING_NAMES[next(iter(modes))]
