"""Output kinds of the embeddings surface (`options.output`) and how raw rows become them.

`dense` (one pooled vector), `sparse` ({indices, values}: SPLADE rows or bge-m3's lexical
weights), `multi_vector` (per-token vectors: bge-m3's ColBERT, PyLate's, or hidden states) and
`tokens` (every token's last hidden state). Each kind's engine output is part of the cache key
(`task_heads/<output>`). A model with an engine serves only the kinds that engine gives
(`on_engine`); an app replica serves the package's kinds.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from vllm_srun.errors import InvalidRequest
from vllm_srun.plugins.bodies import UnsupportedOption

if TYPE_CHECKING:
    from vllm_srun.families.task_heads.layout import Layout
    from vllm_srun.families.task_heads.tokenize import TextEncoder
    from vllm_srun.plugins.base import EngineModel
    from vllm_srun.plugins.package import ModelPackage

DENSE, SPARSE, MULTI_VECTOR, TOKENS = "dense", "sparse", "multi_vector", "tokens"
# The special tokens BGEM3 leaves out of lexical weights, by their tokenizer_config.json keys.
_UNUSED = ("cls_token", "eos_token", "pad_token", "unk_token")


@dataclass(frozen=True)
class OutputKinds:
    """What a model gives beyond its head's own output: the engine output behind each kind."""

    dense: bool = True
    sparse: str | None = None  # "splade" or "lexical"
    multi_vector: str = "hidden"  # "colbert" where the package has the projection
    unused_ids: frozenset[int] = frozenset()
    # The kinds the model's engine cannot give, with the engine's reason (`on_engine`).
    refused: dict[str, str] = dataclasses.field(default_factory=dict, hash=False)

    @property
    def default(self) -> str:
        return DENSE if self.dense else SPARSE if self.sparse is not None else MULTI_VECTOR

    def served(self) -> list[str]:
        kinds = [DENSE] if self.dense else []
        if self.sparse is not None:
            kinds.append(SPARSE)
        late = self.dense or self.multi_vector == "colbert"  # a PyLate package has no dense kind
        kinds = [*kinds, MULTI_VECTOR, TOKENS] if late else [*kinds, TOKENS]
        return [kind for kind in kinds if kind not in self.refused]

    def on_engine(self, engine_model: EngineModel | None) -> OutputKinds:
        """These kinds without those whose engine output `engine_model` refuses (each kept with
        the engine's reason). Dense is the head's own output, served as before; without an
        engine model (an app replica) nothing is left out."""
        if engine_model is None:
            return self
        refused = {}
        for kind in self.served():
            reason = None if kind == DENSE else engine_model.output_refusal(self.engine_output(kind))
            if reason is not None:
                refused[kind] = reason
        return dataclasses.replace(self, refused=refused)

    def engine_output(self, kind: str) -> str:
        """The work-item output behind a non-dense kind."""
        if kind == SPARSE:
            assert self.sparse is not None
            return self.sparse
        return self.multi_vector if kind == MULTI_VECTOR else "hidden"

    def check(self, kind: str, *, model: str, field: str = "options.output") -> None:
        if kind not in self.served():
            why = f": {self.refused[kind]}" if kind in self.refused else ""
            raise UnsupportedOption(
                f"{field}: model {model!r} gives no {kind!r} output{why}; it gives "
                f"{', '.join(self.served()) or 'nothing'}",
                param=field,
            )


def output_kinds(layout: Layout, encoder: TextEncoder, package: ModelPackage) -> OutputKinds:
    """The kinds a package's layout gives (see the module docstring)."""
    if layout.kind == "sparse":
        return OutputKinds(dense=False, sparse="splade")
    if layout.kind != "embedding":
        return OutputKinds()
    if layout.colbert is not None:
        return OutputKinds(dense=False, multi_vector="colbert")
    lexical = "sparse_linear" in layout.output_heads
    return OutputKinds(
        sparse="lexical" if lexical else None,
        multi_vector="colbert" if "colbert_linear" in layout.output_heads else "hidden",
        unused_ids=_unused_ids(layout, encoder, package) if lexical else frozenset(),
    )


def _unused_ids(layout: Layout, encoder: TextEncoder, package: ModelPackage) -> frozenset[int]:
    """The ids of tokenizer_config.json's cls, eos, pad and unk tokens (Transformers'
    special_tokens_map, which BGEM3 reads), else config.json's bos/eos/pad ids."""
    settings: dict[str, Any] = {}
    if layout.tokenizer_config is not None:
        data = package.read_json(layout.tokenizer_config)
        settings = data if isinstance(data, dict) else {}
    ids: set[int] = set()
    for key in _UNUSED:
        token = settings.get(key)
        if isinstance(token, dict):  # an AddedToken as Transformers saves it
            token = token.get("content")
        found = encoder.tokenizer.token_to_id(token) if isinstance(token, str) else None
        if found is not None:
            ids.add(found)
    if not ids:
        ids = {
            int(v)
            for k in ("bos_token_id", "eos_token_id", "pad_token_id")
            if (v := layout.config.get(k)) is not None
        }
    return frozenset(ids)


def refuse_with(kind: str, given: dict[str, Any]) -> None:
    """A 400 for a request field that shapes a dense vector only, given with another kind."""
    for field, value in given.items():
        if value is not None:
            raise InvalidRequest(
                f"{field}: applies to dense output only, not options.output {kind!r}", param=field
            )


def sparse(kinds: OutputKinds, row: np.ndarray, ids: np.ndarray) -> tuple[list[int], list[float]]:
    """One input's sparse embedding from its one row: (ids ascending, weights)."""
    if kinds.sparse == "splade":
        return row[:, 0].astype(np.int64).tolist(), row[:, 1].tolist()
    best: dict[int, float] = {}
    for token, weight in zip(ids.tolist(), row.astype(np.float32).tolist(), strict=True):
        if token in kinds.unused_ids or weight <= 0:
            continue
        if weight > best.get(token, 0.0):
            best[token] = weight
    order = sorted(best)
    return order, [best[t] for t in order]


def multi_vectors(kinds: OutputKinds, kind: str, row: np.ndarray) -> np.ndarray:
    """One input's per-token vectors (see the module docstring)."""
    if kind == MULTI_VECTOR and kinds.multi_vector == "colbert":
        vectors = row[1:].astype(np.float32)
        norms = np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)  # F.normalize's eps
        out: np.ndarray = vectors / norms
        return out
    return row.astype(np.float32)


def maxsim(query: np.ndarray, document: np.ndarray) -> float:
    """Late interaction (ColBERT's MaxSim): the sum over query tokens of the best cosine with
    any document token."""

    def unit(x: np.ndarray) -> np.ndarray:
        x64 = x.astype(np.float64)
        out: np.ndarray = x64 / np.maximum(np.linalg.norm(x64, axis=1, keepdims=True), 1e-12)
        return out

    if not len(query) or not len(document):
        return 0.0
    return float((unit(query) @ unit(document).T).max(axis=1).sum())
