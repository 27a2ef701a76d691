"""What a sentence-transformers package says, read the way `SentenceTransformer` reads it.

`sentence_bert_config.json` (the token limit, lowercasing), `config_sentence_transformers.json`
(prompts, the default prompt, the similarity function) and `modules.json` (Transformer, Pooling,
then Dense and Normalize). The modules after pooling run here in numpy on the pooled vector, so
the cache holds the pooled vector. Only files are read, never code: an activation is one of a
few named torch classes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vllm_srun.errors import InvalidRequest, PackageError
from vllm_srun.plugins.base import WorkItem
from vllm_srun.plugins.bodies import UnsupportedOption
from vllm_srun.plugins.package import ModelPackage

SENTENCE_BERT_CONFIG = "sentence_bert_config.json"
ST_CONFIG = "config_sentence_transformers.json"
MODULES = "modules.json"

_KNOWN_MODULES = {"Transformer", "Pooling", "Dense", "Normalize"}
_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_lasttoken": "last",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_weightedmean_tokens": "weightedmean",
}
_POOLING_NAMES = {"cls": "cls", "mean": "mean", "lasttoken": "last", "last": "last"}


def _tanh(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.tanh(x)
    return out


def _identity(x: np.ndarray) -> np.ndarray:
    return x


def _relu(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.maximum(x, 0.0)
    return out


def _sigmoid(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = 0.5 * (1.0 + np.tanh(0.5 * x))
    return out


# Dense activations by the class name sentence-transformers saves; without one it uses Tanh.
_ACTIVATIONS = {
    "torch.nn.modules.activation.Tanh": _tanh,
    "torch.nn.modules.linear.Identity": _identity,
    "torch.nn.modules.activation.ReLU": _relu,
    "torch.nn.modules.activation.Sigmoid": _sigmoid,
}
_DEFAULT_ACTIVATION = "torch.nn.modules.activation.Tanh"


@dataclass(frozen=True)
class DenseModule:
    """A Dense module's files; its weights are read at load (`load_dense`)."""

    path: str
    in_features: int
    out_features: int
    bias: bool
    activation: str
    residual: bool
    weights: str  # the safetensors file, relative to the package

    def files(self) -> list[str]:
        return [f"{self.path}/config.json", self.weights]


@dataclass(frozen=True)
class Dense:
    """A loaded Dense module: `activation(x @ weight.T + bias)`, plus x (or its projection)
    when the module is residual."""

    weight: np.ndarray
    bias: np.ndarray | None
    activation: str
    residual: np.ndarray | None  # the projection of a residual between different sizes
    use_residual: bool

    def __call__(self, x: np.ndarray) -> np.ndarray:
        out: np.ndarray = x @ self.weight.T
        if self.bias is not None:
            out = out + self.bias
        out = _ACTIVATIONS[self.activation](out)
        if self.use_residual:
            out = out + (x if self.residual is None else x @ self.residual.T)
        return out


@dataclass(frozen=True, kw_only=True)
class SentenceConfig:
    """A sentence-transformers package as the family reproduces it. `steps` are the modules after
    pooling, in order: a DenseModule or "normalize"."""

    pooling: str
    pooling_config: str
    include_prompt: bool = True
    max_seq_length: int | None = None
    do_lower_case: bool = False
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    similarity_fn_name: str = "cosine"
    steps: tuple[DenseModule | str, ...] = ()
    config_files: tuple[str, ...] = ()

    @property
    def normalize(self) -> bool:
        """Whether the final vector is unit length: the last module is a Normalize."""
        return bool(self.steps) and self.steps[-1] == "normalize"

    def dimension(self, hidden_size: int) -> int:
        dense = [s for s in self.steps if isinstance(s, DenseModule)]
        return dense[-1].out_features if dense else hidden_size

    def files(self) -> list[str]:
        """Every file this reads or the modules load, for `verify` to hash."""
        names = [MODULES, self.pooling_config, *self.config_files]
        for step in self.steps:
            if isinstance(step, DenseModule):
                names.extend(step.files())
        return names


def _json_object(package: ModelPackage, relative: str) -> dict[str, Any]:
    data = package.read_json(relative)
    if not isinstance(data, dict):
        raise PackageError(f"{relative} in {package.name!r} is not a JSON object")
    return data


def read_sentence_config(package: ModelPackage) -> SentenceConfig:
    """The package's sentence-transformers configuration; PackageError names what cannot be served."""
    modules = package.read_json(MODULES)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise PackageError(f"{MODULES} in {package.name!r} is not a list of modules")
    pooling: tuple[str, str, bool] | None = None
    steps: list[DenseModule | str] = []
    for module in modules:
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        path = str(module.get("path") or "")
        if kind not in _KNOWN_MODULES:
            raise PackageError(
                f"{MODULES} in {package.name!r} has module {module.get('type')!r}; the family "
                f"reproduces only {sorted(_KNOWN_MODULES)}"
            )
        if kind == "Pooling":
            if pooling is not None:
                raise PackageError(f"{MODULES} in {package.name!r} has two Pooling modules")
            relative = f"{path or '1_Pooling'}/config.json"
            mode, include_prompt = _pooling(package, relative)
            pooling = (relative, mode, include_prompt)
        elif kind in ("Dense", "Normalize") and pooling is None:
            raise PackageError(f"{MODULES} in {package.name!r}: {kind} before Pooling is not supported")
        elif kind == "Dense":
            steps.append(_dense(package, path))
        elif kind == "Normalize":
            steps.append("normalize")
    if pooling is None:
        raise PackageError(f"{MODULES} in {package.name!r} has no Pooling module")
    settings: dict[str, Any] = {}
    config_files: list[str] = []
    if package.exists(SENTENCE_BERT_CONFIG):
        config_files.append(SENTENCE_BERT_CONFIG)
        data = _json_object(package, SENTENCE_BERT_CONFIG)
        limit = data.get("max_seq_length")
        if limit is not None and (not isinstance(limit, int) or limit < 2):
            raise PackageError(f"{SENTENCE_BERT_CONFIG} in {package.name!r}: max_seq_length {limit!r}")
        settings.update(max_seq_length=limit, do_lower_case=bool(data.get("do_lower_case", False)))
    if package.exists(ST_CONFIG):
        config_files.append(ST_CONFIG)
        settings.update(read_prompts(package))
    relative, mode, include_prompt = pooling
    return SentenceConfig(
        pooling=mode,
        pooling_config=relative,
        include_prompt=include_prompt,
        steps=tuple(steps),
        config_files=tuple(config_files),
        **settings,
    )


def read_prompts(package: ModelPackage) -> dict[str, Any]:
    """`prompts`, `default_prompt_name` and `similarity_fn_name` of the package's
    config_sentence_transformers.json; PackageError for prompts that are not texts by name or a
    default that is none of them."""
    data = _json_object(package, ST_CONFIG)
    prompts = data.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()
    ):
        raise PackageError(f"{ST_CONFIG} in {package.name!r}: prompts must map names to texts")
    default = data.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise PackageError(
            f"{ST_CONFIG} in {package.name!r}: default_prompt_name {default!r} is not one of its "
            f"prompts ({', '.join(prompts) or 'none'})"
        )
    similarity = data.get("similarity_fn_name") or "cosine"
    return {
        "prompts": dict(prompts),
        "default_prompt_name": default,
        "similarity_fn_name": str(similarity),
    }


def _pooling(package: ModelPackage, relative: str) -> tuple[str, bool]:
    data = _json_object(package, relative)
    mode = data.get("pooling_mode")
    modes = (
        {mode} if isinstance(mode, str) else {name for key, name in _POOLING_KEYS.items() if data.get(key)}
    )
    if len(modes) != 1 or next(iter(modes)) not in _POOLING_NAMES:
        raise PackageError(
            f"{relative} in {package.name!r} asks for pooling {sorted(modes)}; supported: exactly one "
            "of cls, mean, lasttoken"
        )
    return _POOLING_NAMES[next(iter(modes))], bool(data.get("include_prompt", True))


def _dense(package: ModelPackage, path: str) -> DenseModule:
    config_path = f"{path}/config.json"
    data = _json_object(package, config_path)
    activation = str(data.get("activation_function") or _DEFAULT_ACTIVATION)
    if activation not in _ACTIVATIONS:
        raise PackageError(
            f"{config_path} in {package.name!r}: activation {activation!r} is not one of "
            f"{', '.join(sorted(_ACTIVATIONS))}"
        )
    for name in ("module_input_name", "module_output_name"):
        if data.get(name, "sentence_embedding") != "sentence_embedding":
            raise PackageError(f"{config_path} in {package.name!r}: {name} {data[name]!r} is not supported")
    weights = f"{path}/model.safetensors"
    if not package.exists(weights):
        raise PackageError(
            f"{package.name!r}: the Dense module in {path!r} has no model.safetensors (a pickled "
            "pytorch_model.bin is not loaded)"
        )
    try:
        return DenseModule(
            path=path,
            in_features=int(data["in_features"]),
            out_features=int(data["out_features"]),
            bias=bool(data.get("bias", True)),
            activation=activation,
            residual=bool(data.get("use_residual", False)),
            weights=weights,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise PackageError(f"{config_path} in {package.name!r} is not a Dense config: {exc}") from exc


def load_dense(package: ModelPackage, module: DenseModule) -> Dense:
    """The module's weights, checked against its config: a missing or misshapen tensor is an error."""
    from safetensors.numpy import load_file

    tensors = load_file(str(package.path(module.weights)))
    expected: dict[str, tuple[int, ...]] = {"linear.weight": (module.out_features, module.in_features)}
    if module.bias:
        expected["linear.bias"] = (module.out_features,)
    if module.residual and module.in_features != module.out_features:
        expected["residual.weight"] = (module.out_features, module.in_features)
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if shapes != expected:
        raise PackageError(
            f"{module.weights} in {package.name!r} holds {shapes}; the config needs {expected}"
        )
    residual = tensors.get("residual.weight")
    return Dense(
        weight=tensors["linear.weight"].astype(np.float64),
        bias=tensors["linear.bias"].astype(np.float64) if module.bias else None,
        activation=module.activation,
        residual=None if residual is None else residual.astype(np.float64),
        use_residual=module.residual,
    )


@dataclass(frozen=True)
class PostPooling:
    """The modules after pooling, loaded: applied to each pooled vector in order."""

    steps: Sequence[Dense | str] = ()

    def __call__(self, vector: np.ndarray, *, final_normalize: bool = True) -> np.ndarray:
        """`vector` through the modules; `final_normalize=False` leaves out a trailing Normalize."""
        out = vector.astype(np.float64).reshape(-1)
        steps = self.steps
        if not final_normalize and steps and steps[-1] == "normalize":
            steps = steps[:-1]
        for step in steps:
            if isinstance(step, Dense):
                out = step(out)
            else:
                norm = float(np.linalg.norm(out))
                # F.normalize divides by max(norm, eps).
                out = out / max(norm, 1e-12)
        return out


def load_post_pooling(package: ModelPackage, config: SentenceConfig | None) -> PostPooling:
    if config is None:
        return PostPooling()
    return PostPooling(
        tuple(load_dense(package, s) if isinstance(s, DenseModule) else s for s in config.steps)
    )


def prompt_length(token_ids: Sequence[int], special_ids: set[int]) -> int:
    """How many leading tokens a prompt covers, as sentence-transformers counts them for a Pooling
    with include_prompt false: the prompt tokenised alone, less a trailing special token."""
    length = len(token_ids)
    if length and token_ids[-1] in special_ids:
        length -= 1
    return length


def select_prompt(
    config: SentenceConfig | None,
    *,
    model: str,
    prompt: str | None,
    prompt_name: str | None,
    input_type: str | None,
    token_ids: bool,
) -> str:
    """The prompt a request selects (a raw `prompt`, a `prompt_name`, or the prompt named by
    `input_type`), else the package's default; "" for none. Token ids take none: a prompt the
    request names for them is an InvalidRequest; a name the package does not have is the model's
    refusal, an UnsupportedOption (422)."""
    given = {"prompt": prompt, "prompt_name": prompt_name, "input_type": input_type}
    chosen = [name for name, value in given.items() if value is not None]
    if len(chosen) > 1:
        raise InvalidRequest(
            f"{chosen[1]}: give one of prompt, prompt_name and input_type, not {' and '.join(chosen)}",
            param=chosen[1],
        )
    if chosen and token_ids:
        raise InvalidRequest(
            f"{chosen[0]}: a prompt applies to texts; token ids are taken as given", param=chosen[0]
        )
    prompts = config.prompts if config is not None else {}
    if prompt is not None:
        return prompt
    name = prompt_name or input_type
    if name is None:
        default = config.default_prompt_name if config is not None else None
        return prompts[default] if default is not None and not token_ids else ""
    if name not in prompts:
        known = ", ".join(repr(p) for p in prompts) or "none"
        raise UnsupportedOption(  # the prompts are the package's: 422
            f"{chosen[0]}: model {model!r} has no prompt named {name!r}; its prompts: {known}",
            param=chosen[0],
        )
    return prompts[name]


# How a work item names the layer it exits at: "<output>@<layer>", as the native engine reads
# it (vllm_srun.engines.native.engine).
EXIT_SEPARATOR = "@"


def declared_layers(num_layers: int, engine_model: Any, *, has_weights: bool) -> list[int]:
    """The encoder layers (1-based) whose pooled output `/v1/embeddings` serves, last one last.

    Every layer where the engine can exit early (the native engine's `exit_layers`), else the
    last only. An app replica has no engine: it declares every layer when the package has the
    safetensors the native engine (the one `auto` picks for them) runs, else the last only.
    """
    if num_layers < 1:
        return []
    if engine_model is None:
        exits: Sequence[int] = range(1, num_layers + 1) if has_weights else ()
    else:
        exits = getattr(engine_model, "exit_layers", ())
    return list(exits) if list(exits)[-1:] == [num_layers] else [num_layers]


def exit_layer(requested: int | None, layers: Sequence[int], *, model: str) -> int | None:
    """The earlier layer a request's `layer` exits at; None for the last layer, named or not, so
    its vectors share the default's cache entries. A layer the model does not declare is an
    UnsupportedOption (the model's refusal, 422) naming `layer`."""
    if requested is None or list(layers[-1:]) == [requested]:
        return None
    if requested not in layers:
        served = (
            (f"layers 1..{layers[-1]}" if len(layers) > 1 else f"only its last layer, {layers[-1]}")
            if layers
            else "no layer choice"
        )
        raise UnsupportedOption(
            f"layer: model {model!r} has no exit at layer {requested}; it serves {served}", param="layer"
        )
    return requested


def at_layer(items: Sequence[WorkItem], layer: int) -> None:
    """Point `items` at an earlier layer's output; the layer enters their cache keys, so vectors
    from different layers never share an entry."""
    for item in items:
        item.output = f"{item.output}{EXIT_SEPARATOR}{layer}"
        item.key_extra += f"/layer={layer}"
