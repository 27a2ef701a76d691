"""GET /v1/models (every served model, and every plugin with its distribution and version) and
GET /v1/models/{id} (one model); the same routes under /vllm/v1 and /vllm, vLLM's base URLs.
A model is described by its card: OpenAI's model object (`id`, `object`, `created`,
`owned_by`) and the upstream runtime's ModelCard (2.3.0), with upstream's names and types;
our own further fields (`aliases`, `state`, `routes`, …) use names upstream does not use.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from litestar import get
from litestar.datastructures import State

from vllm_srun import defaults
from vllm_srun.app.embedding_types import describe as describe_quantization
from vllm_srun.app.loading import ServedModel
from vllm_srun.app.runtime import Runtime
from vllm_srun.app.service.health import ModelState, Status, model_states
from vllm_srun.plugins.base import HeadInfo, HeadWindow, LoadedModel, RerankExit
from vllm_srun.plugins.bodies import NUMERICS, served_profile
from vllm_srun.plugins.decision_bodies import MAX_CHOICES, MAX_LEVELS, MIN_CHOICES, MIN_LEVELS
from vllm_srun.plugins.decisions import DecisionModel

# The kinds of classify head upstream's HeadCard names; a head of another kind (an embedder's
# pooled output, a pair scorer's relevance, an NLI readout) is listed under `other_heads`.
CLASSIFY_HEAD_KINDS = ("sequence", "scores", "token")
# A head's kind as upstream's classify kinds name it: a relevance head (a cross-encoder's one
# label) answers classify with label scores.
_CLASSIFY_KIND = {**{kind: kind for kind in CLASSIFY_HEAD_KINDS}, "relevance": "scores"}
# Surfaces whose requests count inputs against `--max-inputs` (upstream's `limits.max_inputs`).
_INPUT_SURFACES = ("classify", "embeddings", "rerank")
# Our golden check's outcomes in upstream's GoldenStatus words.
_GOLDEN = {"verified": "matched", "unverified": "unverified", "failed": "failed"}


class HeadCard(msgspec.Struct, omit_defaults=True):
    name: str
    kind: Literal["sequence", "scores", "token"]
    labels: list[str]
    inputs: list[str] | None = None
    default_threshold: float | None = None
    thresholds: list[float] | None = None
    overflow: Literal["reject", "truncate", "window"] | None = None
    window: HeadWindow | None = None
    reduction: Literal["max", "span_union"] | None = None


class EmbeddingCard(msgspec.Struct, omit_defaults=True):
    """Upstream's EmbeddingCard; `dimension` (the full width) and `similarity_fn_name` are ours."""

    dimensions: list[int]
    layers: list[int]
    modalities: list[str]
    normalized: bool
    pooling: str
    input_types: list[str]
    dimension: int | None = None
    similarity_fn_name: str | None = None


class RerankCard(msgspec.Struct):
    exits: list[RerankExit]
    default: RerankExit


class ModelLimits(msgspec.Struct, omit_defaults=True):
    max_input_tokens: int | None = None
    max_inputs: int | None = None
    min_options: int | None = None
    max_options: int | None = None
    min_levels: int | None = None
    max_levels: int | None = None


class ProfileInfo(msgspec.Struct, omit_defaults=True):
    name: str
    numerics: Literal["exact", "approximate"]
    description: str | None = None


class GoldenStatus(msgspec.Struct, omit_defaults=True):
    status: Literal["pending", "matched", "unverified", "failed"]
    checked: int | None = None
    matched: int | None = None
    reference: str | None = None


class PluginInfo(msgspec.Struct):
    group: str
    name: str
    distribution: str | None
    version: str | None
    capabilities: dict[str, Any]


class ModelCard(msgspec.Struct, omit_defaults=True, kw_only=True):
    """One served model. From `aliases` on the fields are ours, not upstream's."""

    id: str
    object: Literal["model"]
    family: str
    surfaces: list[str]
    ready: bool
    status: Status
    golden: GoldenStatus
    plugins: list[PluginInfo]
    created: int
    owned_by: str = msgspec.field(default_factory=lambda: "vllm-srun")
    reason: str | None = None
    repo: str | None = None
    revision: str | None = None
    model_sha256: str | None = None
    question_types: list[str] | None = None
    presets: list[str] | None = None
    modalities: list[str] | None = None
    heads: list[HeadCard] | None = None
    embedding: EmbeddingCard | None = None
    rerank: RerankCard | None = None
    limits: ModelLimits | None = None
    licence: str | None = None
    profile: str | None = None
    profiles: list[ProfileInfo] | None = None
    engine: str | None = None
    accelerator: str | None = None
    device: str | None = None
    dtype: str | None = None
    parameters: int | None = None
    # Ours: the dtypes the engine can run on this device here (the CPU's instruction sets), and
    # why `dtype` (the option that chose it; for --max-speed, what the hardware runs natively
    # and any dtype its twin check refused first).
    dtypes: list[str] | None = None
    dtype_reason: str | None = None
    # Ours. (A default_factory other than a bare `list` is written out even under omit_defaults.)
    aliases: list[str] = msgspec.field(default_factory=lambda: [])
    state: str = msgspec.field(default_factory=lambda: "loading")
    numerics: str | None = None
    max_tokens: int | None = None
    routes: list[str] | None = None
    other_heads: list[HeadInfo] | None = None
    outputs: list[str] | None = None  # the kinds options.output takes on embeddings
    approximation: dict[str, Any] | None = None
    # An embedder's output types (options.embedding_type) and the calibration int8/uint8 read.
    quantization: dict[str, Any] | None = None
    # The forward paths the live workers' engines choose between (`engine` is the one named at
    # start), and the memory each path adds beyond the model's weights, in bytes.
    engine_paths: list[str] | None = None
    memory_bytes: dict[str, int] | None = None


class ProcessLimits(msgspec.Struct):
    """What one request to this process may hold; more is a 413 for the whole request."""

    max_bundle_tasks: int
    max_request_bytes: int


class ModelList(msgspec.Struct, kw_only=True):
    """Every served model; `plugins` (every installed plugin, by group) is ours."""

    api_version: str
    object: Literal["list"]
    data: list[ModelCard]
    limits: ProcessLimits
    plugins: dict[str, Any]


# The app-state key of the mounted surface routes: each path and the surface it reaches.
ROUTES_KEY = "surface_routes"


def routes_of(surfaces: list[str], routes: dict[str, str]) -> list[str]:
    """The paths that reach a model serving `surfaces`, of `routes` (each path and its surface;
    a surface a plugin names that the app has no route for has none)."""
    return [path for name in surfaces for path, surface in routes.items() if surface == name]


def profile_of(numerics: str) -> ProfileInfo:
    """A numerics setting as upstream's profile: float32 is the exact reference, any other
    (bfloat16, float16) an approximation of it named after itself."""
    name = served_profile(numerics)  # the name options.profile must give, and meta.profile says
    # In `serve --help`'s words for --dtype.
    description = NUMERICS.get(numerics, f"{numerics} numerics")
    return ProfileInfo(
        name=name, numerics="exact" if numerics == "float32" else "approximate", description=description
    )


def golden_of(served: ServedModel) -> GoldenStatus:
    if served.golden is not None:
        return GoldenStatus(
            status=_GOLDEN.get(served.golden, "unverified"),  # type: ignore[arg-type]
            checked=served.golden_checked,
            matched=served.golden_matched,
            reference=served.golden_reference,
        )
    # Not run: still to come while the model comes up; never, for one that failed before it.
    return GoldenStatus(status="unverified" if served.state == "failed" else "pending")


def plugins_of(runtime: Runtime, served: ServedModel) -> list[PluginInfo]:
    """The family, engine and accelerator that serve the model, as installed."""
    named = [("families", served.family)]
    if served.placement is not None:
        named += [
            ("engines", served.placement.engine),
            ("accelerators", served.placement.device.partition(":")[0]),
        ]
    found = []
    for group, name in named:
        entry = runtime.plugins.of(group).get(name) if name else None
        if entry is not None:
            found.append(
                PluginInfo(
                    group=group,
                    name=entry.name,
                    distribution=entry.distribution,
                    version=entry.version,
                    capabilities=entry.plugin.descriptor(),
                )
            )
    return found


def head_card(head: HeadInfo) -> HeadCard:
    return HeadCard(
        name=head.name,
        kind=_CLASSIFY_KIND[head.kind],  # type: ignore[arg-type]  # the caller checks it is one
        labels=list(head.labels or []),
        inputs=head.inputs,
        default_threshold=head.default_threshold if head.default_threshold is not None else head.threshold,
        thresholds=head.thresholds,
        overflow=head.overflow,  # type: ignore[arg-type]  # a family states upstream's policies
        window=head.window,
        reduction=head.reduction,  # type: ignore[arg-type]
    )


def input_types(model: LoadedModel) -> list[str]:
    """The roles (query, document) an embedder takes as `input_type`: those its family states,
    else those its package has prompts for."""
    view = model.info.embedding
    if view is None:
        return []
    prompts = model.prompts()
    return list(view.input_types or [t for t in ("query", "document") if t in prompts])


def _facts(model: LoadedModel, max_inputs: int, routes: dict[str, str]) -> dict[str, Any]:
    """What the card says of a loaded model, from its family's ModelInfo."""
    info = model.info
    decisions = "decisions" in info.surfaces
    classify = "classify" in info.surfaces
    heads = [
        h for h in info.heads if h.kind in CLASSIFY_HEAD_KINDS or (classify and h.kind in _CLASSIFY_KIND)
    ]
    others = [h for h in info.heads if h not in heads]
    facts: dict[str, Any] = {
        "surfaces": list(info.surfaces),
        "model_sha256": info.model_sha256,
        "heads": [head_card(h) for h in heads] if heads else None,
        "other_heads": others or None,
        "licence": info.licence,
        "parameters": info.parameters,
        "numerics": info.numerics,
        "max_tokens": info.max_tokens,
        "profile": profile_of(info.numerics).name,
        "profiles": [profile_of(info.numerics)],
        "routes": routes_of(info.surfaces, routes),
        "outputs": info.outputs or None,
    }
    limits = ModelLimits(max_input_tokens=info.max_tokens)
    if any(s in info.surfaces for s in _INPUT_SURFACES):
        limits.max_inputs = max_inputs
    if decisions:
        # What a state may carry: text only, for every decision model this runtime can run.
        types, modalities = list(info.question_types), ["text"]
        if isinstance(model, DecisionModel):
            types = types or list(model.question_types)
            modalities = list(getattr(model, "modalities", modalities))
        facts.update(question_types=types, presets=list(info.presets), modalities=modalities)
        limits.min_options, limits.max_options = MIN_CHOICES, MAX_CHOICES
        limits.min_levels, limits.max_levels = MIN_LEVELS, MAX_LEVELS
    facts["limits"] = limits
    if info.embedding is not None:
        view = info.embedding
        facts["embedding"] = EmbeddingCard(
            dimensions=list(view.dimensions or [view.dimension]),
            layers=list(view.layers),
            modalities=list(view.modalities),
            normalized=view.normalized,
            pooling=view.pooling,
            input_types=input_types(model),
            dimension=view.dimension,
            similarity_fn_name=view.similarity_fn_name,
        )
    if info.rerank is not None:
        facts["rerank"] = RerankCard(exits=list(info.rerank.exits), default=info.rerank.default)
    return facts


def card(
    runtime: Runtime,
    served: ServedModel,
    state: ModelState,
    routes: dict[str, str],
    engines: dict[str, Any] | None = None,
) -> ModelCard:
    """The card of one served model, in whatever state; `routes` are the app's surface routes
    (`ROUTES_KEY`), `engines` what its live workers' engines say (QueueClient.engines)."""
    placement = served.placement
    facts = _facts(served.model, runtime.settings.max_inputs, routes) if served.model is not None else {}
    return ModelCard(
        id=served.name,
        object="model",
        family=served.model.info.family if served.model is not None else served.family or "",
        surfaces=facts.pop("surfaces", []),
        ready=state.status == "ready",
        status=state.status,
        reason=state.reason,
        golden=golden_of(served),
        plugins=plugins_of(runtime, served),
        created=served.created,
        repo=served.repository,
        revision=served.revision,
        engine=placement.engine if placement else None,
        accelerator=placement.device.partition(":")[0] if placement else None,
        device=placement.device if placement else None,
        dtype=placement.dtype if placement else None,
        dtypes=list(placement.dtypes) if placement and placement.dtypes else None,
        dtype_reason=placement.reason or None if placement else None,
        aliases=list(served.aliases),
        state=state.state,
        approximation=served.approximation,
        quantization=describe_quantization(served.calibration, served.model) if served.model else None,
        **(engines or {}),
        **facts,
    )


# vLLM's server lists its models at /v1/models too; `peers/vllm/models.py` mounts these two
# under /vllm and /vllm/v1, its base URLs here.
@get("/v1/models", summary="Served models and installed plugins")
async def list_models(state: State) -> ModelList:
    runtime: Runtime = state.runtime
    states = await model_states(runtime)
    return ModelList(
        api_version=defaults.API_VERSION,
        object="list",
        data=[
            card(runtime, served, states[name], state[ROUTES_KEY], await runtime.queue.workers.engines(name))
            for name, served in runtime.models.items()
        ],
        limits=ProcessLimits(
            max_bundle_tasks=runtime.settings.max_bundle_tasks,
            max_request_bytes=runtime.settings.max_request_bytes,
        ),
        plugins=runtime.plugins.describe(),
    )


@get(
    "/v1/models/{model_id:path}",
    summary="One served model, by its id or an alias",
)
async def retrieve_model(state: State, model_id: str) -> ModelCard:
    # A path parameter keeps the slash of a Hugging Face id (`org/name`); it starts with one.
    runtime: Runtime = state.runtime
    served = runtime.named(model_id.removeprefix("/"))
    engines = await runtime.queue.workers.engines(served.name)
    return card(runtime, served, (await model_states(runtime))[served.name], state[ROUTES_KEY], engines)
