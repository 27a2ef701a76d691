"""The output heads the onnxruntime engine computes on the host, from what the graph gives.

Each head reads one graph output and applies the native head's formula (engines/native/
outputs.py) in numpy on the row's real tokens: `splade` from masked-LM logits; `lexical` and
`colbert` from the last hidden state and bge-m3's state dicts (read with torch). A head the
graph or installation cannot give is refused at load, with the reason.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vllm_srun.errors import PackageError
from vllm_srun.plugins.architectures import architecture_of
from vllm_srun.plugins.base import ModelSpec

# bge-m3's heads: the output each gives. A SPLADE package's head is its architecture row's
# `sparse_head` (bert_mlm, distilbert_mlm), whatever its name.
PROJECTION_HEADS = {"sparse_linear": "lexical", "colbert_linear": "colbert"}
SPLADE = "splade"
HEAD_OUTPUTS = (SPLADE, *PROJECTION_HEADS.values())


@dataclass(frozen=True)
class Linear:
    """A torch.nn.Linear's tensors, applied in float32 as it applies them: x @ weight.T + bias."""

    weight: np.ndarray  # [out, in]
    bias: np.ndarray | None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        y: np.ndarray = x.astype(np.float32) @ self.weight.T
        return y if self.bias is None else y + self.bias


@dataclass(frozen=True)
class Projections:
    """What the engine read of a package's state dicts: each projection head's Linear by head
    name, or why none could be read."""

    linears: dict[str, Linear] = field(default_factory=dict)
    refusal: str | None = None


def read_projections(spec: ModelSpec) -> Projections:
    """The projection heads' tensors of `spec.extra["state_dicts"]` (host-side work, done in the
    engine's `read`). A state dict that holds anything but tensors is a PackageError, as on the
    native engine; without torch installed nothing is read and the heads are refused."""
    files: Mapping[str, Path] = {
        prefix: Path(path)
        for prefix, path in (spec.extra.get("state_dicts") or {}).items()
        if prefix in PROJECTION_HEADS
    }
    if not files:
        return Projections()
    if importlib.util.find_spec("torch") is None:
        names = ", ".join(sorted(p.name for p in files.values()))
        return Projections(
            refusal=f"reading {names} needs torch (torch.load with weights_only=True): "
            "pip install 'vllm-srun[torch]'"
        )
    import torch

    from vllm_srun.engines.native.outputs import read_state_dicts

    tensors = read_state_dicts(files, torch.float32)
    linears: dict[str, Linear] = {}
    for prefix, path in files.items():
        weight = tensors.get(f"{prefix}.weight")
        if weight is None or weight.dim() != 2:
            raise PackageError(f"{path.name} has no 2-dimensional 'weight' tensor (a Linear's state dict)")
        bias = tensors.get(f"{prefix}.bias")
        linears[prefix] = Linear(
            weight.numpy().astype(np.float32), None if bias is None else bias.numpy().astype(np.float32)
        )
    return Projections(linears=linears)


def splade(logits: np.ndarray) -> np.ndarray:
    """SPLADE's max pooling of one row's logits [T, vocab]: its non-zero (id, weight) pairs, as
    engines/native/outputs.py's `splade` gives them."""
    weights = np.log1p(np.maximum(logits.astype(np.float32), 0)).max(axis=0)
    ids = np.flatnonzero(weights > 0)
    return np.stack([ids.astype(np.float32), weights[ids]], axis=1)


@dataclass(frozen=True)
class HostHeads:
    """The head outputs a loaded graph gives: by output, the graph output it reads; `refused`
    holds the reason for each head output the package declares and this graph cannot give."""

    sources: dict[str, str] = field(default_factory=dict)
    linears: dict[str, Linear] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)

    def row(self, output: str, value: np.ndarray) -> np.ndarray:
        """`output` of one row from its graph output [T, ...] (the row's real tokens)."""
        if output == SPLADE:
            return splade(value)
        head = next(h for h, o in PROJECTION_HEADS.items() if o == output)
        projected = self.linears[head](value)
        return np.maximum(projected, 0).reshape(-1) if output == "lexical" else projected


def host_heads(
    spec: ModelSpec,
    graph: Mapping[str, str],
    widths: Mapping[str, Any],
    projections: Projections,
) -> HostHeads:
    """The heads `spec.extra["outputs"]` declares, matched to the graph's outputs: `graph` maps
    the engine's graph kinds (hidden, token_logits, ...) to output names, `widths` gives each
    output name's last dimension as the session reports it (an int, or a name when dynamic)."""
    row = architecture_of(spec.architecture)
    masked_lm = row.sparse_head if row is not None else None
    sources: dict[str, str] = {}
    refused: dict[str, str] = {}
    for head in spec.extra.get("outputs") or ():
        if head == masked_lm:
            output, (source, reason) = SPLADE, _masked_lm_logits(spec, graph, widths)
        elif head in PROJECTION_HEADS:
            output, (source, reason) = (
                PROJECTION_HEADS[head],
                _hidden_for(head, spec, graph, widths, projections),
            )
        else:
            continue
        if source is not None:
            sources[output] = source
        elif reason is not None:
            refused[output] = reason
    return HostHeads(sources=sources, linears=projections.linears, refused=refused)


def _masked_lm_logits(
    spec: ModelSpec, graph: Mapping[str, str], widths: Mapping[str, Any]
) -> tuple[str | None, str | None]:
    """(the graph output of masked-LM logits per token, None), or (None, why there is none)."""
    name = graph.get("token_logits")
    if name is None:
        return None, (
            "SPLADE reads the masked-LM logits per token (an output named like logits, "
            f"[batch, sequence, vocab]), and the ONNX graph gives {_gives(graph)}"
        )
    vocab, width = spec.config.get("vocab_size"), widths.get(name)
    if isinstance(width, int) and isinstance(vocab, int) and width != vocab:
        return None, (
            f"the ONNX graph's {name!r} has {width} logits per token, not one per vocabulary id "
            f"({vocab}): SPLADE reads the masked-LM logits"
        )
    return name, None


def _hidden_for(
    head: str,
    spec: ModelSpec,
    graph: Mapping[str, str],
    widths: Mapping[str, Any],
    projections: Projections,
) -> tuple[str | None, str | None]:
    """(the hidden-state output a projection head reads, None), or (None, why it cannot run);
    a projection whose width does not fit the graph is the package's error."""
    if "hidden" not in graph:
        return None, f"{head} reads the last hidden state, and the ONNX graph gives {_gives(graph)}"
    if projections.refusal is not None:
        return None, projections.refusal
    linear = projections.linears.get(head)
    if linear is None:
        return None, f"the package has no {head}.pt"
    width = widths.get(graph["hidden"])
    hidden = width if isinstance(width, int) else spec.config.get("hidden_size")
    if isinstance(hidden, int) and linear.weight.shape[1] != hidden:
        raise PackageError(
            f"{head}.pt takes {linear.weight.shape[1]} features; the ONNX graph's "
            f"{graph['hidden']!r} has {hidden}"
        )
    return graph["hidden"], None


def _gives(graph: Mapping[str, str]) -> str:
    return ", ".join(f"{name!r} ({kind})" for kind, name in sorted(graph.items())) or "nothing"
