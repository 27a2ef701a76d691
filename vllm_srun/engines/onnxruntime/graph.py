"""What an ONNX graph may contain before the engine runs it, and what its outputs mean.

A graph is refused when it uses an operator outside the standard ONNX domain and onnxruntime's
"com.microsoft" domain (a model-local function is allowed when its body passes; the check needs
the `onnx` package), and when any tensor is external data: the family hashes one graph file,
and a path in a graph could name any file the server reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from vllm_srun.errors import ConfigError

ALLOWED_DOMAINS = frozenset({"", "ai.onnx", "com.microsoft"})
INPUTS = ("input_ids", "attention_mask", "token_type_ids", "position_ids")
HIDDEN_KINDS = ("hidden", "mean", "cls", "last")


def _subgraphs(node: Any) -> Iterator[Any]:
    for attribute in node.attribute:
        if attribute.HasField("g"):
            yield attribute.g
        yield from attribute.graphs


def _nodes(graph: Any) -> Iterator[Any]:
    for node in graph.node:
        yield node
        for sub in _subgraphs(node):
            yield from _nodes(sub)


def _tensors(graph: Any) -> Iterator[Any]:
    """Every tensor a graph carries: initializers, sparse ones, and constants in node attributes
    (a Constant's `value` may point to external data as well as an initializer can)."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield from (sparse.values, sparse.indices)
    for node in graph.node:
        yield from _attribute_tensors(node)


def _attribute_tensors(node: Any) -> Iterator[Any]:
    for attribute in node.attribute:
        if attribute.HasField("t"):
            yield attribute.t
        yield from attribute.tensors
        sparse = [attribute.sparse_tensor] if attribute.HasField("sparse_tensor") else []
        for tensor in [*sparse, *attribute.sparse_tensors]:
            yield from (tensor.values, tensor.indices)
        if attribute.HasField("g"):
            yield from _tensors(attribute.g)
        for graph in attribute.graphs:
            yield from _tensors(graph)


def check_graph(data: bytes, where: str) -> None:
    """Raise ConfigError when the graph at `where` uses custom operators or external data."""
    try:
        import onnx
    except ImportError:  # the `onnx` extra installs it; without it nothing is checked, so refuse
        raise ConfigError(
            f"{where}: the onnx package is needed to check a graph before it runs (pip install onnx)"
        ) from None
    try:
        model = onnx.load_model_from_string(data)
    except Exception as exc:  # protobuf's DecodeError and friends
        raise ConfigError(f"{where}: not an ONNX graph ({type(exc).__name__}: {exc})") from exc
    local = {(f.domain, f.name) for f in model.functions}
    nodes: list[Any] = list(_nodes(model.graph))
    for function in model.functions:
        nodes.extend(function.node)
    custom = sorted(
        {
            f"{n.domain}:{n.op_type}"
            for n in nodes
            if n.domain not in ALLOWED_DOMAINS and (n.domain, n.op_type) not in local
        }
    )
    if custom:
        raise ConfigError(
            f"{where}: the ONNX graph uses custom operators {custom}; only standard ONNX and "
            "onnxruntime contrib (com.microsoft) operators are run"
        )
    tensors = list(_tensors(model.graph))
    for function in model.functions:
        for node in function.node:
            tensors.extend(_attribute_tensors(node))
    external = [
        t.name or "(unnamed)"
        for t in tensors
        if t.data_location == onnx.TensorProto.EXTERNAL or len(t.external_data)
    ]
    if external:
        raise ConfigError(
            f"{where}: the ONNX graph keeps {len(external)} tensors in external data (e.g. {external[0]!r}); "
            "export it as one file"
        )


def output_kinds(outputs: Iterable[tuple[str, int]]) -> dict[str, str]:
    """Map what a graph can give (logits, token_logits, hidden) to its output names.

    Outputs are (name, rank): rank 2 named like logits are per-sequence logits, rank 3 named
    like logits are per-token logits, any other rank 3 output is a last hidden state. The
    first output of each kind wins (exports list the primary output first).
    """
    kinds: dict[str, str] = {}
    for name, rank in outputs:
        is_logits = "logits" in name.lower()
        kind = {2: "logits" if is_logits else None, 3: "token_logits" if is_logits else "hidden"}.get(rank)
        if kind is not None:
            kinds.setdefault(kind, name)
    return kinds


def check_inputs(names: Iterable[str], where: str) -> set[str]:
    found = set(names)
    unknown = found - set(INPUTS)
    if unknown or "input_ids" not in found:
        raise ConfigError(
            f"{where}: ONNX graph inputs {sorted(found)} are not supported; expected input_ids, "
            "attention_mask and optionally token_type_ids, position_ids"
        )
    return found
