"""ColBERT packages in PyLate's form, read the way `pylate.models.ColBERT` reads them.

A sentence-transformers package with PyLate Dense modules and no Pooling; PyLate's settings
(prefixes, `query_length`/`document_length`, query expansion, `attend_to_expansion_tokens`,
`skiplist_words`) come from config_sentence_transformers.json with PyLate's defaults. A prefix
the tokenizer lacks is refused. The engine returns every position's projected vector
("colbert"), so the cache holds those; the prefix, expansion, skiplist and L2 normalisation
are applied here.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from vllm_srun.errors import PackageError
from vllm_srun.families.task_heads.sentence import MODULES, SENTENCE_BERT_CONFIG, ST_CONFIG
from vllm_srun.plugins.architectures import standard_config
from vllm_srun.plugins.package import ModelPackage, usable_positions

QUERY, DOCUMENT = "query", "document"
# The output head the engine installs (engines/native/outputs.py); each Dense module's weights
# load under `pylate_dense.<i>`.
HEAD = "pylate_dense"
_IDENTITY = "torch.nn.modules.linear.Identity"
_WEIGHTS = ("model.safetensors", "pytorch_model.bin")  # the .bin read with weights_only=True


def is_pylate(package: ModelPackage) -> bool:
    """Whether modules.json names a PyLate module (cheap: one small file)."""
    try:
        modules = package.read_json(MODULES)
    except PackageError:
        return False
    return isinstance(modules, list) and any(
        isinstance(m, dict) and str(m.get("type", "")).startswith("pylate.") for m in modules
    )


@dataclass(frozen=True, kw_only=True)
class ColbertConfig:
    """A PyLate package's settings (see the module docstring) and the files they come from."""

    query_prefix: str = "[Q] "
    document_prefix: str = "[D] "
    query_length: int = 32
    document_length: int = 180
    do_query_expansion: bool = True
    attend_to_expansion_tokens: bool = False
    skiplist_words: tuple[str, ...] = tuple(string.punctuation)
    do_lower_case: bool = False
    dimension: int = 0
    config_files: tuple[str, ...] = ()
    # Each Dense module's weights, by the prefix they load under (Layout.state_dicts).
    weights: tuple[tuple[str, str], ...] = ()

    @property
    def attends_to_expansion(self) -> bool:
        return self.do_query_expansion and self.attend_to_expansion_tokens


def _object(package: ModelPackage, relative: str) -> dict[str, Any]:
    data = package.read_json(relative)
    if not isinstance(data, dict):
        raise PackageError(f"{relative} in {package.name!r} is not a JSON object")
    return data


def _dense(package: ModelPackage, path: str, width: int) -> tuple[str, int]:
    """A Dense module's config (checked to be one this reproduces) and weights file; returns
    the file and the module's output width."""
    relative = f"{path}/config.json"
    data = _object(package, relative)
    activation = data.get("activation_function") or _IDENTITY
    if activation != _IDENTITY:
        raise PackageError(
            f"{relative} in {package.name!r}: activation {activation!r} is not served (PyLate's "
            f"Dense modules use {_IDENTITY})"
        )
    if data.get("use_residual"):
        raise PackageError(f"{relative} in {package.name!r}: use_residual is not served")
    try:
        in_features, out_features = int(data["in_features"]), int(data["out_features"])
    except (KeyError, TypeError, ValueError) as exc:
        raise PackageError(f"{relative} in {package.name!r} is not a Dense config: {exc}") from exc
    if in_features != width:
        raise PackageError(
            f"{relative} in {package.name!r}: in_features {in_features}, but the module before gives {width}"
        )
    found = next((f"{path}/{n}" for n in _WEIGHTS if package.exists(f"{path}/{n}", state_dict=True)), None)
    if found is None:
        raise PackageError(f"{package.name!r}: the Dense module in {path!r} has no {' or '.join(_WEIGHTS)}")
    return found, out_features


def read_colbert(package: ModelPackage, hidden_size: int) -> ColbertConfig:
    """The package's PyLate settings; PackageError names what cannot be served."""
    modules = package.read_json(MODULES)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise PackageError(f"{MODULES} in {package.name!r} is not a list of modules")
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    if len(kinds) < 2 or kinds[0] != "Transformer" or any(k != "Dense" for k in kinds[1:]):
        raise PackageError(
            f"{MODULES} in {package.name!r} has modules {kinds}; a PyLate ColBERT package is served "
            "as a Transformer followed by Dense modules"
        )
    files = [MODULES]
    weights: list[tuple[str, str]] = []
    width = hidden_size
    for index, module in enumerate(modules[1:]):
        path = str(module.get("path") or "")
        weights_file, width = _dense(package, path, width)
        files.append(f"{path}/config.json")
        weights.append((f"{HEAD}.{index}", weights_file))
    settings: dict[str, Any] = {}
    if package.exists(SENTENCE_BERT_CONFIG):
        files.append(SENTENCE_BERT_CONFIG)
        settings["do_lower_case"] = bool(_object(package, SENTENCE_BERT_CONFIG).get("do_lower_case", False))
    if package.exists(ST_CONFIG):
        files.append(ST_CONFIG)
        settings.update(_settings(package, _object(package, ST_CONFIG)))
    config = ColbertConfig(dimension=width, config_files=tuple(files), weights=tuple(weights), **settings)
    if config.query_length < 3 or config.document_length < 3:
        raise PackageError(
            f"{ST_CONFIG} in {package.name!r}: query_length and document_length must be at least 3"
        )
    # An expanded query is query_length tokens whatever its text (a document is cut to the
    # model's limit): past the position table every query would fail in the forward.
    positions = usable_positions(standard_config(_object(package, "config.json")))
    if config.do_query_expansion and config.query_length > positions:
        raise PackageError(
            f"{ST_CONFIG} in {package.name!r}: query_length {config.query_length} (every query, "
            f"expanded) exceeds the model's {positions} positions"
        )
    return config


def _settings(package: ModelPackage, data: dict[str, Any]) -> dict[str, Any]:
    """PyLate's keys of config_sentence_transformers.json, type-checked; absent ones left out."""
    out: dict[str, Any] = {}
    types: dict[str, type] = {
        "query_prefix": str,
        "document_prefix": str,
        "query_length": int,
        "document_length": int,
        "do_query_expansion": bool,
        "attend_to_expansion_tokens": bool,
    }
    for key, kind in types.items():
        value = data.get(key)
        if value is None:
            continue
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise PackageError(f"{ST_CONFIG} in {package.name!r}: {key} {value!r} is not a {kind.__name__}")
        out[key] = value
    words = data.get("skiplist_words")
    if words is not None:
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
            raise PackageError(f"{ST_CONFIG} in {package.name!r}: skiplist_words must be a list of strings")
        out["skiplist_words"] = tuple(words)
    default = data.get("default_prompt_name")
    prompts = data.get("prompts") or {}
    if default is not None and isinstance(prompts, dict) and prompts.get(default):
        raise PackageError(
            f"{ST_CONFIG} in {package.name!r}: a default prompt ({default!r}) is not served for a "
            "PyLate package"
        )
    return out


@dataclass(frozen=True)
class Codec:
    """A PyLate package's rows: how a query or a document becomes token ids and key count,
    and which of its vectors it keeps. Built at load from the tokenizer."""

    config: ColbertConfig
    prefix_ids: dict[str, int | None]
    mask_id: int | None
    skiplist: frozenset[int]

    def length(self, role: str) -> int:
        return self.config.query_length if role == QUERY else self.config.document_length

    def budget(self, role: str) -> int:
        """The tokens of the tokenized text (special tokens included) a row of `role` holds."""
        return self.length(role) - (self.prefix_ids[role] is not None)

    def row_length(self, tokens: int, role: str) -> int:
        """The length of the row of a tokenized text of `tokens` tokens."""
        length = tokens + (self.prefix_ids[role] is not None)
        if role == QUERY and self.config.do_query_expansion:
            return max(length, self.config.query_length)
        return length

    def row(self, ids: Sequence[int], role: str) -> tuple[list[int], int]:
        """The engine row of a tokenized text (within `budget`): its ids, and how many of them
        are attention keys (0: all)."""
        prefix = self.prefix_ids[role]
        row = list(ids[:1]) + ([prefix] if prefix is not None else []) + list(ids[1:])
        if role != QUERY or not self.config.do_query_expansion:
            return row, 0
        assert self.mask_id is not None
        real = len(row)
        row += [self.mask_id] * (self.config.query_length - real)
        return row, 0 if self.config.attend_to_expansion_tokens or real == len(row) else real

    def vectors(self, values: np.ndarray, ids: Sequence[int], role: str) -> np.ndarray:
        """The normalised vectors a row of `role` keeps, from the engine's [T, dim] values."""
        vectors = values.astype(np.float32)
        if role == DOCUMENT and self.skiplist:
            row, _ = self.row(ids, role)
            vectors = vectors[[i not in self.skiplist for i in row]]
        norms = np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)  # F.normalize's eps
        out: np.ndarray = vectors / norms
        return out


def _token(settings: dict[str, Any], key: str) -> str | None:
    token = settings.get(key)
    if isinstance(token, dict):  # an AddedToken as Transformers saves it
        token = token.get("content")
    return token if isinstance(token, str) else None


def codec(config: ColbertConfig, tokenizer: Any, tokenizer_config: dict[str, Any], *, name: str) -> Codec:
    """The codec of a package's settings over its tokenizer (a `tokenizers.Tokenizer`)."""
    if tokenizer_config.get("padding_side", "right") != "right":
        raise PackageError(
            f"{name!r}: tokenizer_config.json pads on the {tokenizer_config['padding_side']!r}; PyLate "
            "inserts the prefix after the first token, which is served for right padding only"
        )
    prefixes: dict[str, int | None] = {}
    for role, prefix in ((QUERY, config.query_prefix), (DOCUMENT, config.document_prefix)):
        found = tokenizer.token_to_id(prefix) if prefix else None
        if prefix and found is None:
            raise PackageError(
                f"{name!r}: tokenizer.json has no token {prefix!r} ({role}_prefix); PyLate would add it "
                "with a new, unsaved embedding row"
            )
        prefixes[role] = found
    mask = _token(tokenizer_config, "mask_token") or "[MASK]"
    mask_id = tokenizer.token_to_id(mask)
    if config.do_query_expansion and mask_id is None:
        raise PackageError(f"{name!r}: query expansion needs a mask token; tokenizer.json has no {mask!r}")
    unk = _token(tokenizer_config, "unk_token") or "[UNK]"
    unk_id = tokenizer.token_to_id(unk)
    skiplist = {tokenizer.token_to_id(word) for word in config.skiplist_words}
    if None in skiplist:
        skiplist.discard(None)
        if unk_id is not None:  # convert_tokens_to_ids answers unknown words with the unk id
            skiplist.add(unk_id)
    return Codec(config, prefixes, mask_id, frozenset(i for i in skiplist if i is not None))
