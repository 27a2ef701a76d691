"""Output heads: per-token readouts that give sparse and multi-vector embeddings.

Named by the family in `ModelSpec.extra["outputs"]` and installed before the weights load, at
their checkpoint names: `bert_mlm`/`distilbert_mlm` (SPLADE: "splade" rows of [k, 2] (id,
weight)), `sparse_linear` (bge-m3 "lexical", [T]), `colbert_linear` and `pylate_dense`
("colbert", [T, dim]). bge-m3's `.pt` state dicts are read with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from vllm_srun.engines.native.heads import EncoderModel, install
from vllm_srun.engines.native.layers import activation
from vllm_srun.errors import ConfigError, PackageError


class OutputHead:
    """One readout: `output` is the work-item output it answers; `__init__` installs modules."""

    output: ClassVar[str]

    def __init__(self, model: EncoderModel, config: Mapping[str, Any]) -> None:
        self.hidden = int(config["hidden_size"])

    def rows(self, model: EncoderModel, hidden: torch.Tensor) -> torch.Tensor:
        """This head's value for one row's token states [T, hidden]."""
        raise NotImplementedError


class Transform(nn.Module):
    """BERT's `cls.predictions.transform`: dense, activation, LayerNorm."""

    def __init__(self, hidden: int, act: str, eps: float) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.act = activation(act)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.act(self.dense(x)))  # type: ignore[no-any-return]


class Predictions(nn.Module):
    """BERT's `cls.predictions`: the transform and the decoder's bias (its weight is tied)."""

    def __init__(self, hidden: int, vocab: int, act: str, eps: float) -> None:
        super().__init__()
        self.transform = Transform(hidden, act, eps)
        self.bias = nn.Parameter(torch.zeros(vocab))


class Cls(nn.Module):
    def __init__(self, predictions: Predictions) -> None:
        super().__init__()
        self.predictions = predictions


def _tied(config: Mapping[str, Any], name: str) -> None:
    if config.get("tie_word_embeddings", True) is False:
        raise ConfigError(
            f"{name}: a masked-LM head with its own decoder (tie_word_embeddings false) is not "
            "supported; SPLADE checkpoints tie it to the word embeddings"
        )


def splade(logits: torch.Tensor) -> torch.Tensor:
    """SPLADE's max pooling of one row's logits [T, vocab]: the non-zero (id, weight) pairs."""
    weights = torch.log1p(torch.relu(logits.float())).amax(dim=0)
    ids = torch.nonzero(weights > 0).reshape(-1)
    return torch.stack([ids.float(), weights[ids]], dim=1)


class BertMaskedLm(OutputHead):
    """BERT's *ForMaskedLM head, read as SPLADE."""

    output = "splade"

    def __init__(self, model: EncoderModel, config: Mapping[str, Any]) -> None:
        super().__init__(model, config)
        _tied(config, "bert_mlm")
        predictions = Predictions(
            self.hidden,
            int(config["vocab_size"]),
            config.get("hidden_act", "gelu"),
            float(config.get("layer_norm_eps", 1e-12)),
        )
        install(model, "cls", Cls(predictions))

    def rows(self, model: EncoderModel, hidden: torch.Tensor) -> torch.Tensor:
        predictions = model.get_submodule("cls.predictions")
        words = model.get_submodule(f"{model.prefix}.embeddings.word_embeddings")
        logits = predictions.transform(hidden) @ words.weight.T + predictions.bias
        return splade(logits)


class DistilBertMaskedLm(OutputHead):
    """DistilBERT's *ForMaskedLM head (`vocab_transform`, `vocab_layer_norm`, `vocab_projector`
    tied to the word embeddings), read as SPLADE."""

    output = "splade"

    def __init__(self, model: EncoderModel, config: Mapping[str, Any]) -> None:
        super().__init__(model, config)
        _tied(config, "distilbert_mlm")
        self.act = activation(config.get("activation", "gelu"))
        install(model, "vocab_transform", nn.Linear(self.hidden, self.hidden))
        install(model, "vocab_layer_norm", nn.LayerNorm(self.hidden, eps=1e-12))  # Transformers' fixed eps
        projector = nn.Module()
        projector.register_parameter("bias", nn.Parameter(torch.zeros(int(config["vocab_size"]))))
        install(model, "vocab_projector", projector)

    def rows(self, model: EncoderModel, hidden: torch.Tensor) -> torch.Tensor:
        x = model.vocab_layer_norm(self.act(model.vocab_transform(hidden)))
        words = model.get_submodule(f"{model.prefix}.embeddings.word_embeddings")
        return splade(x @ words.weight.T + model.vocab_projector.bias)


class SparseLinear(OutputHead):
    """bge-m3's `sparse_linear`: relu(Linear(hidden, 1)) per token."""

    output = "lexical"

    def __init__(self, model: EncoderModel, config: Mapping[str, Any]) -> None:
        super().__init__(model, config)
        install(model, "sparse_linear", nn.Linear(self.hidden, 1))

    def rows(self, model: EncoderModel, hidden: torch.Tensor) -> torch.Tensor:
        return torch.relu(model.sparse_linear(hidden)).reshape(-1)


class ColbertLinear(OutputHead):
    """bge-m3's `colbert_linear`: Linear(hidden, dim) per token; its width is the checkpoint's
    (`config["colbert_dim"]`, which `install_outputs` reads from the tensor's shape)."""

    output = "colbert"

    def __init__(self, model: EncoderModel, config: Mapping[str, Any]) -> None:
        super().__init__(model, config)
        dim = int(config.get("colbert_dim") or self.hidden)
        install(model, "colbert_linear", nn.Linear(self.hidden, dim))

    def rows(self, model: EncoderModel, hidden: torch.Tensor) -> torch.Tensor:
        return model.colbert_linear(hidden)  # type: ignore[no-any-return]


class _Projection(nn.Module):
    """One PyLate Dense module: its `linear`, at the checkpoint's names (`linear.weight`, ...)."""

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, bias=bias)


class PylateDense(OutputHead):
    """PyLate's Dense modules, in order, on every token: `pylate_dense.<i>.linear.*`. Their
    shapes are the checkpoint's (`config["pylate_dense"]`, which `install_outputs` reads)."""

    output = "colbert"

    def __init__(self, model: EncoderModel, config: Mapping[str, Any]) -> None:
        super().__init__(model, config)
        layers = config.get("pylate_dense") or []
        if not layers:
            raise ConfigError("pylate_dense: the package's Dense weights hold no linear.weight")
        install(model, "pylate_dense", nn.ModuleList(_Projection(i, o, b) for o, i, b in layers))

    def rows(self, model: EncoderModel, hidden: torch.Tensor) -> torch.Tensor:
        for layer in model.pylate_dense:
            hidden = layer.linear(hidden)
        return hidden


OUTPUT_HEADS: dict[str, type[OutputHead]] = {
    "bert_mlm": BertMaskedLm,
    "distilbert_mlm": DistilBertMaskedLm,
    "sparse_linear": SparseLinear,
    "colbert_linear": ColbertLinear,
    "pylate_dense": PylateDense,
}
# The outputs an output head answers.
HEAD_OUTPUTS = frozenset(cls.output for cls in OUTPUT_HEADS.values())


def install_outputs(
    model: EncoderModel,
    names: tuple[str, ...],
    config: Mapping[str, Any],
    tensors: Mapping[str, torch.Tensor],
) -> dict[str, OutputHead]:
    """Install the output heads `names` on `model`; return them by the output each answers.
    A projection's width is the checkpoint's (`tensors`, as read)."""
    colbert = tensors.get("colbert_linear.weight")
    if colbert is not None:
        config = {**config, "colbert_dim": int(colbert.shape[0])}
    dense = []
    while (weight := tensors.get(f"pylate_dense.{len(dense)}.linear.weight")) is not None:
        bias = f"pylate_dense.{len(dense)}.linear.bias" in tensors
        dense.append((int(weight.shape[0]), int(weight.shape[1]), bias))
    if dense:
        config = {**config, "pylate_dense": dense}
    out: dict[str, OutputHead] = {}
    for name in names:
        cls = OUTPUT_HEADS.get(name)
        if cls is None:
            raise ConfigError(f"unknown output head {name!r} (known: {', '.join(OUTPUT_HEADS)})")
        out[cls.output] = cls(model, config)
    return out


def read_state_dicts(files: Mapping[str, Path], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The tensors of PyTorch state-dict files, each name under its file's prefix
    (`{"sparse_linear": path}` gives `sparse_linear.weight`, ...). `weights_only=True`: a file
    that holds anything but tensors and plain containers is refused, never executed."""
    tensors: dict[str, torch.Tensor] = {}
    for prefix, path in files.items():
        try:
            if path.suffix == ".safetensors":
                from safetensors.torch import load_file

                state = load_file(str(path))
            else:
                state = torch.load(str(path), map_location="cpu", weights_only=True)
        except Exception as exc:  # UnpicklingError for anything but tensors, or a corrupt file
            raise PackageError(f"{path.name} is not a tensor-only PyTorch state dict: {exc}") from exc
        if not isinstance(state, dict) or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
        ):
            raise PackageError(f"{path.name} is not a state dict of named tensors")
        for name, tensor in state.items():
            tensors[f"{prefix}.{name}"] = tensor.to(dtype) if tensor.is_floating_point() else tensor
    return tensors
