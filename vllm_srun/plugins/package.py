"""A model package on disk, with the file access rules every family goes through.

Files are addressed by their path relative to the package root. A path that leaves the
package, directly or through a symlink, is refused; so is a pickled PyTorch checkpoint.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from vllm_srun import defaults
from vllm_srun.errors import PackageError
from vllm_srun.plugins.spec import ModelSpec

_CHUNK = 1 << 20
# Hugging Face writes 1e30 for "no limit"; anything this large is not a real limit.
_NO_LIMIT = 1_000_000


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def combined_sha256(files: dict[str, str]) -> str:
    """The identity of a set of files: their relative names and digests, in name order."""
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode())
        digest.update(b"\0")
        digest.update(files[name].encode())
        digest.update(b"\n")
    return digest.hexdigest()


class ModelPackage:
    """A directory holding one model. All reads go through `path()` so the rules hold."""

    def __init__(self, root: Path | str, *, name: str | None = None) -> None:
        root = Path(root)
        if not root.is_dir():
            raise PackageError(f"model package {str(root)!r} is not a directory")
        self.root = root.resolve()
        self.name = name or self.root.name

    def __repr__(self) -> str:
        return f"ModelPackage({str(self.root)!r})"

    def path(self, relative: str, *, state_dict: bool = False) -> Path:
        """The resolved path of `relative`; refused if it resolves outside the package, or if
        it is a pickle, unless `state_dict`: a tensor-only PyTorch file that the one reader
        of it loads with `torch.load(weights_only=True)` (bge-m3's extra heads)."""
        candidate = (self.root / relative).resolve()
        if candidate != self.root and self.root not in candidate.parents:
            raise PackageError(f"{relative!r} leaves the model package {str(self.root)!r}")
        if not state_dict and relative.endswith((".bin", ".pt", ".pth", ".pkl", ".ckpt")):
            raise PackageError(
                f"{relative!r} is a pickled checkpoint; the runtime loads safetensors only "
                "(convert it with `safetensors.torch.save_file`)"
            )
        return candidate

    def exists(self, relative: str, *, state_dict: bool = False) -> bool:
        try:
            return self.path(relative, state_dict=state_dict).is_file()
        except PackageError:
            return False

    def read_bytes(self, relative: str) -> bytes:
        path = self.path(relative)
        if not path.is_file():
            raise PackageError(f"model package {str(self.root)!r} has no file {relative!r}")
        return path.read_bytes()

    def read_json(self, relative: str) -> Any:
        try:
            return json.loads(self.read_bytes(relative))
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
            raise PackageError(f"{relative!r} in {str(self.root)!r} is not valid JSON: {exc}") from exc

    def digests(self, relatives: list[str], *, state_dicts: Sequence[str] = ()) -> dict[str, str]:
        """SHA-256 of each named file (and of the tensor-only `state_dicts`, see `path`),
        refusing any that is missing or leaves the package."""
        out: dict[str, str] = {}
        for relative in [*relatives, *state_dicts]:
            path = self.path(relative, state_dict=relative in state_dicts)
            if not path.is_file():
                raise PackageError(f"model package {str(self.root)!r} has no file {relative!r}")
            out[relative] = sha256_file(path)
        return out


def checkpoint_spec(
    family: str, package: ModelPackage, config: Mapping[str, Any], weights: Sequence[str], onnx: str | None
) -> ModelSpec:
    """The spec of a Hugging Face checkpoint: `architectures[0]`, its config, the weight files
    (resolved inside the package), and the ONNX graph when the package ships one."""
    extra: dict[str, Any] = {"onnx": str(package.path(onnx))} if onnx is not None else {}
    return ModelSpec(
        family=family,
        architecture=str(config["architectures"][0]),
        config=config,
        weight_files=tuple(package.path(name) for name in weights),
        extra=extra,
    )


# Where a checkpoint ships its ONNX graph, in the order families look.
ONNX_PATHS = ("onnx/model.onnx", "model.onnx")


def usable_positions(config: Mapping[str, Any]) -> int:
    """How many positions a row may use: the position table, less the offset of models whose
    positions start after the padding index (RoBERTa's 514 rows hold 512 positions); see
    `Architecture.standard_config`."""
    if "usable_positions" in config:
        return int(config["usable_positions"])
    return int(config.get("max_position_embeddings") or defaults.FALLBACK_MAX_TOKENS)


def checkpoint_max_tokens(
    package: ModelPackage, config: Mapping[str, Any], tokenizer_config: str | None
) -> int:
    """The most tokens a Hugging Face checkpoint reads: the tokenizer's model_max_length when
    it is a real limit, never above the positions (`defaults.FALLBACK_MAX_TOKENS` when
    config.json states none)."""
    positions = usable_positions(config)
    if tokenizer_config is not None:
        data = package.read_json(tokenizer_config)
        limit = data.get("model_max_length") if isinstance(data, dict) else None
        if isinstance(limit, int | float) and 0 < limit < _NO_LIMIT:
            return min(int(limit), positions)
    return positions
