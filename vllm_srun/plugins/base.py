"""The plugin contract: families, loaded models, engines and accelerators.

A *family* knows a model format: it detects a package, verifies its files, describes what an
engine must build, and turns surface requests into work items and results into responses.
An *engine* builds and runs the network; an *accelerator* names the hardware. The queue only
ever sees `WorkItem`s and the arrays `LoadedModel.run` returns.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import msgspec
import numpy as np

from vllm_srun.plugins.package import ModelPackage
from vllm_srun.plugins.spec import ModelSpec as ModelSpec  # re-exported: plugins import it from here

if TYPE_CHECKING:
    from tokenizers import Tokenizer


class WorkItem(msgspec.Struct, array_like=True, omit_defaults=True):
    """One sequence for one forward.

    `output` tells the engine what to return for this row (for example "logits", "hidden",
    "mean"); `key_extra` holds the surface options that change the result and so enter the
    cache key. `cache_key` is filled in by the queue; `cost` defaults to the token count.
    `key_tokens`, where set (0: all), makes only the row's first so many tokens keys of its
    attention: the rest attend to them and give outputs, but none attends to them (ColBERT's
    query expansion). The family puts it in `key_extra`, since it changes the result.
    """

    token_ids: list[int]
    type_ids: list[int] | None = None
    output: str = "default"
    key_extra: str = ""
    cache_key: str = ""
    cost: int = 0
    key_tokens: int = 0

    def tokens(self) -> int:
        return self.cost or len(self.token_ids)


class ItemError(msgspec.Struct, frozen=True):
    """An error that belongs to one item: it is reported in place of that item's result."""

    code: str
    message: str


Result = np.ndarray | ItemError


@dataclass(kw_only=True)
class Plan:
    """A request split into work items; `state` is the family's own, read back in finish."""

    surface: str
    items: list[WorkItem]
    state: Any = None


@dataclass(kw_only=True)
class Batch:
    """Work items packed back to back: row i is `token_ids[offsets[i]:offsets[i + 1]]`.
    `key_lengths[i]` is how many leading tokens of row i are attention keys (`WorkItem.key_tokens`);
    None when every token of every row is."""

    token_ids: np.ndarray
    offsets: np.ndarray
    outputs: list[str]
    type_ids: np.ndarray | None = None
    key_lengths: np.ndarray | None = None

    @classmethod
    def from_items(cls, items: Sequence[WorkItem]) -> Batch:
        lengths = [len(item.token_ids) for item in items]
        offsets = np.zeros(len(items) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = np.fromiter(
            (t for item in items for t in item.token_ids), dtype=np.int64, count=int(offsets[-1])
        )
        type_ids = None
        if any(item.type_ids is not None for item in items):
            type_ids = np.fromiter(
                (t for item in items for t in (item.type_ids or [0] * len(item.token_ids))),
                dtype=np.int64,
                count=int(offsets[-1]),
            )
        keys = None
        if any(item.key_tokens for item in items):
            keys = np.asarray([item.key_tokens or n for item, n in zip(items, lengths, strict=True)], dtype=np.int64)
        return cls(
            token_ids=flat,
            offsets=offsets,
            outputs=[i.output for i in items],
            type_ids=type_ids,
            key_lengths=keys,
        )

    def __len__(self) -> int:
        return len(self.outputs)

    def row(self, i: int) -> np.ndarray:
        return self.token_ids[int(self.offsets[i]) : int(self.offsets[i + 1])]


@dataclass(frozen=True, kw_only=True)
class Verification:
    """The identity of a package: every loaded file's digest and the digest over all of them."""

    model_sha256: str
    files: Mapping[str, str]
    max_tokens: int | None = None
    licence: str | None = None


class HeadWindow(msgspec.Struct):
    """The windows a head reads a long input in by default (the upstream contract's HeadWindow)."""

    tokens: int
    overlap: int


class HeadInfo(msgspec.Struct, omit_defaults=True):
    """One head. The fields after `threshold` are the upstream contract's HeadCard facts a
    family knows of a classify head; None where it states none (the card leaves them out).

    `inputs` the forms it accepts (text, pair, grounded); `thresholds` the packaged operating
    point, one per label; `overflow` its policy for a long input; `reduction` how windows
    combine (max, span_union)."""

    name: str
    kind: str
    labels: list[str] | None = None
    threshold: float | None = None
    inputs: list[str] | None = None
    default_threshold: float | None = None
    thresholds: list[float] | None = None
    overflow: str | None = None
    window: HeadWindow | None = None
    reduction: str | None = None


class EmbeddingView(msgspec.Struct):
    """An embedder's facts. `dimensions` the output sizes a request may ask for (empty: only
    `dimension`), `layers` the layers whose pooled output a request may ask for (empty: the
    last only), `input_types` the roles (query, document) it has prompts for."""

    dimension: int
    normalized: bool
    pooling: str = "mean"
    # sentence-transformers' similarity function for the vectors (cosine, dot, ...), if stated.
    similarity_fn_name: str | None = None
    dimensions: list[int] = msgspec.field(default_factory=list)
    layers: list[int] = msgspec.field(default_factory=list)
    modalities: list[str] = msgspec.field(default_factory=lambda: ["text"])
    input_types: list[str] = msgspec.field(default_factory=list)


class RerankExit(msgspec.Struct):
    """A pair scorer's exit: the layer it reads out at and that readout's width."""

    layer: int
    dimension: int


class RerankView(msgspec.Struct):
    """A pair scorer's exits and the one a request gets by default."""

    exits: list[RerankExit]
    default: RerankExit


class ModelInfo(msgspec.Struct, omit_defaults=True):
    """What `/v1/models` shows of a model, and what planning needs to know about it."""

    name: str
    family: str
    surfaces: list[str]
    model_sha256: str
    numerics: str = "float32"
    heads: list[HeadInfo] = msgspec.field(default_factory=list)
    embedding: EmbeddingView | None = None
    max_tokens: int | None = None
    licence: str | None = None
    # Decision models: the question types it answers and the questions it defines (upstream's
    # `question_types`, `presets`); empty: the decisions base's types, no preset.
    question_types: list[str] = msgspec.field(default_factory=list)
    presets: list[str] = msgspec.field(default_factory=list)
    rerank: RerankView | None = None
    # The weights' element count, where the family knows it.
    parameters: int | None = None
    # The kinds `options.output` takes on embeddings (dense, sparse, multi_vector, tokens);
    # empty: the family names none (dense only).
    outputs: list[str] = msgspec.field(default_factory=list)


class Plugin:
    """What every plugin class has: a registered name and a self-description."""

    name: ClassVar[str] = ""

    def descriptor(self) -> dict[str, Any]:
        """A JSON-able description shown by `vllm-srun plugins` and `/v1/models`."""
        return {"name": self.name}


@dataclass(frozen=True)
class Device:
    """One device of an accelerator: `cpu`, `cuda:1`, `example_host`.

    `provider` is the accelerator plugin that offers the device, attached when the loader
    resolves it, so that an engine can ask it for its torch device and kernels. It is not part
    of the device's identity: devices compare and hash by name only.
    """

    accelerator: str
    index: int | None = None
    provider: Accelerator | None = field(default=None, compare=False, repr=False)

    @property
    def name(self) -> str:
        return self.accelerator if self.index is None else f"{self.accelerator}:{self.index}"

    def __str__(self) -> str:
        return self.name


class Accelerator(Plugin, abc.ABC):
    """A kind of hardware. Without `auto_priority` it is used only when named."""

    auto_priority: ClassVar[int | None] = None

    @abc.abstractmethod
    def available(self) -> bool: ...

    @abc.abstractmethod
    def devices(self) -> list[Device]: ...

    def torch_device(self, device: Device) -> Any:
        """The `torch.device` that runs `device`; an accelerator without one cannot run torch
        engines such as the built-in native engine."""
        raise NotImplementedError(f"accelerator {self.name!r} has no torch device")

    def kernels(self) -> dict[str, Any]:
        """Optional kernels this hardware offers an engine (name -> callable); an engine uses
        the names it knows and ignores the rest. The native engine knows
        `scaled_dot_product_attention`, called as `torch.nn.functional.scaled_dot_product_attention`
        is (q, k, v as [rows, heads, width, head_dim], keyword `attn_mask`)."""
        return {}

    def dtype_refusal(self, dtype: str, device: Device) -> str | None:
        """None when `device` runs `dtype` at its own speed, else why not (what the hardware
        lacks), for the start to refuse it with. The base answers None: an accelerator that
        does not say is taken at its word."""
        return None

    def descriptor(self) -> dict[str, Any]:
        return {"name": self.name, "available": self.available(), "auto_priority": self.auto_priority}


class EngineModel(abc.ABC):
    """A network built on a device; `encode` runs one forward over a ready batch."""

    device: Device
    dtype: str

    @abc.abstractmethod
    def encode(self, batch: Batch) -> list[np.ndarray]:
        """One float32 array per row of the batch, shaped by that row's `output`."""

    def output_refusal(self, output: str) -> str | None:
        """None when `encode` gives rows of the work-item output `output`, else why not, in words
        that name the engine. Families ask at load, so that a request for an output this engine
        cannot give is refused when it is planned, not failed at forward time. The base answers
        None: an engine that does not say is found out at forward time."""
        return None


class Engine(Plugin, abc.ABC):
    """Builds and runs networks. Engines without `auto_priority` are tried after the rest."""

    auto_priority: ClassVar[int | None] = None
    dtypes: ClassVar[tuple[str, ...]] = ("float32",)

    @abc.abstractmethod
    def supports(self, spec: ModelSpec, device: Device) -> str | None:
        """None when this engine can run `spec` on `device`, else the reason it cannot."""

    def read(self, spec: ModelSpec, dtype: str) -> Any:
        """Host-side work (reading, converting tensors) done before the device is taken."""
        return None

    @abc.abstractmethod
    def load(self, spec: ModelSpec, device: Device, dtype: str, host: Any) -> EngineModel: ...

    def dtype_refusal(self, dtype: str, device: Device) -> str | None:
        """None when this engine runs `dtype` on `device`, else why not. The base: any of
        `dtypes`, on any device."""
        if dtype in self.dtypes:
            return None
        return f"engine {self.name!r} runs {', '.join(self.dtypes)}, not {dtype}"

    def descriptor(self) -> dict[str, Any]:
        return {"name": self.name, "auto_priority": self.auto_priority, "dtypes": list(self.dtypes)}


class LoadedModel(abc.ABC):
    """A model ready to plan and finish requests; with an engine model it can also run them.

    An app replica holds a LoadedModel with `engine_model=None`: it plans and finishes only.
    """

    batch_invariant: bool = False
    # Surfaces on which this model reads an unset `options.overflow` (None) itself; elsewhere
    # planning hands it "reject", or "truncate" under `serve --auto-truncate`.
    unset_overflow_surfaces: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, info: ModelInfo, engine_model: EngineModel | None) -> None:
        self.info = info
        self.engine_model = engine_model

    @abc.abstractmethod
    def plan_surface(self, surface: str, request: Any) -> Plan:
        """Split a decoded surface request into work items. Raise InvalidRequest for bad input.

        `request` is an instance of the surface's descriptor's `request_type`
        (`vllm_srun.plugins.surfaces.REGISTRY`). A surface the model does not serve raises
        UnsupportedSurface: never a fall-through to another surface."""

    @abc.abstractmethod
    def finish_surface(self, plan: Plan, results: Sequence[Result]) -> Any:
        """Turn results (aligned with `plan.items`) into the response Struct of `plan.surface`
        (its descriptor's `response_type`); a plan of a surface it does not serve raises
        UnsupportedSurface."""

    def tokenizer(self) -> Tokenizer | None:
        """The `tokenizers.Tokenizer` the model plans with (padding and truncation off), for
        routes that expose or count tokens (TEI's /tokenize, Cohere's max_tokens_per_doc);
        None for a model without one, which those routes refuse."""
        return None

    def prompts(self) -> dict[str, str]:
        """The prompts the model's package names (sentence-transformers' `prompts`); {} for none."""
        return {}

    def run(self, items: Sequence[WorkItem]) -> list[np.ndarray]:
        """One forward over `items`. Runs on the device worker's thread, never in the app."""
        if self.engine_model is None:
            raise RuntimeError(f"model {self.info.name!r} was loaded without an engine")
        return self.engine_model.encode(Batch.from_items(items))


class ModelFamily(Plugin, abc.ABC):
    """A model format. `detect` is cheap; `verify` hashes files but reads no weights."""

    surfaces: ClassVar[tuple[str, ...]] = ()
    builtin_table: ClassVar[str | None] = None
    fixture_writer: ClassVar[str | None] = None
    # When several families recognise one package, the most specific wins (a family for NLI
    # classifiers over one for any classifier); equal specificity is an error naming both.
    specificity: ClassVar[int] = 0
    # What `detect` looks for in a folder, in a user's words: a folder no family recognises is
    # refused with each family's. A family that does not say is listed as not saying.
    looks_for: ClassVar[str] = ""

    @abc.abstractmethod
    def detect(self, package: ModelPackage) -> bool: ...

    @abc.abstractmethod
    def verify(self, package: ModelPackage) -> Verification: ...

    @abc.abstractmethod
    def describe(self, package: ModelPackage) -> ModelSpec: ...

    @abc.abstractmethod
    def load(
        self,
        package: ModelPackage,
        spec: ModelSpec,
        engine_model: EngineModel | None,
        *,
        name: str,
        verification: Verification,
        numerics: str,
    ) -> LoadedModel: ...

    def descriptor(self) -> dict[str, Any]:
        return {"name": self.name, "surfaces": list(self.surfaces)}
