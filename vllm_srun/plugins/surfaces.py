"""The surface descriptors: one `Surface` per kind of work (classify, embeddings, rerank, decisions).

A descriptor says what admission, bulk jobs, the client and the families need of a surface:
its request and response types, whether bulk jobs take it, how it counts inputs and text, the
options it reads, and how a finished body is completed. `REGISTRY` holds them all. The bodies
live in `surface_bodies` and are re-exported here; the HTTP routes onto each surface are the app's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import msgspec

from vllm_srun.errors import InvalidRequest
from vllm_srun.plugins.bodies import ItemErrorCode as ItemErrorCode
from vllm_srun.plugins.bodies import Options as Options
from vllm_srun.plugins.bodies import Overflow as Overflow
from vllm_srun.plugins.bodies import ResponseMeta as ResponseMeta
from vllm_srun.plugins.bodies import Usage as Usage
from vllm_srun.plugins.bodies import WindowOptions as WindowOptions
from vllm_srun.plugins.decision_bodies import (
    DECISIONS_OPTIONS,
    DecisionsRequest,
    DecisionsResponse,
    StateValue,
    count_questions,
)
from vllm_srun.plugins.surface_bodies import (
    CLASSIFY_OPTIONS as CLASSIFY_OPTIONS,
)
from vllm_srun.plugins.surface_bodies import (
    EMBEDDINGS_OPTIONS as EMBEDDINGS_OPTIONS,
)
from vllm_srun.plugins.surface_bodies import (
    RERANK_OPTIONS as RERANK_OPTIONS,
)
from vllm_srun.plugins.surface_bodies import (
    AudioPart as AudioPart,
)
from vllm_srun.plugins.surface_bodies import (
    ClassifyInput as ClassifyInput,
)
from vllm_srun.plugins.surface_bodies import (
    ClassifyItem as ClassifyItem,
)
from vllm_srun.plugins.surface_bodies import (
    ClassifyKind as ClassifyKind,
)
from vllm_srun.plugins.surface_bodies import (
    ClassifyOptions as ClassifyOptions,
)
from vllm_srun.plugins.surface_bodies import (
    ClassifyRequest as ClassifyRequest,
)
from vllm_srun.plugins.surface_bodies import (
    ClassifyResponse as ClassifyResponse,
)
from vllm_srun.plugins.surface_bodies import (
    ClassifyResult as ClassifyResult,
)
from vllm_srun.plugins.surface_bodies import (
    ClassifyWindow as ClassifyWindow,
)
from vllm_srun.plugins.surface_bodies import (
    ContentPart as ContentPart,
)
from vllm_srun.plugins.surface_bodies import (
    Embedding as Embedding,
)
from vllm_srun.plugins.surface_bodies import (
    EmbeddingsOptions as EmbeddingsOptions,
)
from vllm_srun.plugins.surface_bodies import (
    EmbeddingsRequest as EmbeddingsRequest,
)
from vllm_srun.plugins.surface_bodies import (
    EmbeddingsResponse as EmbeddingsResponse,
)
from vllm_srun.plugins.surface_bodies import (
    EmbeddingsUsage as EmbeddingsUsage,
)
from vllm_srun.plugins.surface_bodies import (
    ImagePart as ImagePart,
)
from vllm_srun.plugins.surface_bodies import (
    InputUsage as InputUsage,
)
from vllm_srun.plugins.surface_bodies import (
    RerankDocument as RerankDocument,
)
from vllm_srun.plugins.surface_bodies import (
    RerankOptions as RerankOptions,
)
from vllm_srun.plugins.surface_bodies import (
    RerankRequest as RerankRequest,
)
from vllm_srun.plugins.surface_bodies import (
    RerankResponse as RerankResponse,
)
from vllm_srun.plugins.surface_bodies import (
    RerankResult as RerankResult,
)
from vllm_srun.plugins.surface_bodies import (
    Span as Span,
)
from vllm_srun.plugins.surface_bodies import (
    SparseEmbedding as SparseEmbedding,
)
from vllm_srun.plugins.surface_bodies import (
    TextPair as TextPair,
)
from vllm_srun.plugins.surface_bodies import (
    TokenIds as TokenIds,
)
from vllm_srun.plugins.surface_bodies import (
    TokenProbabilities as TokenProbabilities,
)
from vllm_srun.plugins.surface_bodies import (
    texts_of as texts_of,
)


class SurfaceRequest(Protocol):
    """What every surface request has: the model it names and the common options."""

    @property
    def model(self) -> str | None: ...

    @property
    def options(self) -> Options: ...


RequestT = TypeVar("RequestT", bound=SurfaceRequest)


@dataclass(frozen=True, kw_only=True)
class Surface(Generic[RequestT]):
    """One surface.

    `count(request)` is how many inputs a request carries, checked against `--max-inputs`;
    `counted_field` names them in that 413. `text_chars(request)` is how much text it
    carries, which decides whether planning (tokenising) runs off the event loop.
    `options` names the fields of the shared `Options` the surface reads: a request that sets
    any other is refused naming it (`check_options`) rather than having it ignored.
    `complete(body)` fills, on any family's response, what the contract requires and a family
    may leave out (rerank's `logit`): `finish` applies it, so no family can skip it.
    `check(request)` refuses what decoding lets through and the document does not (a classify
    item without its text), so a job line or a bundle task is refused as its route refuses it.
    """

    name: str
    request_type: type[RequestT]
    response_type: type[Any]
    bulk: bool
    counted_field: str
    count: Callable[[RequestT], int]
    text_chars: Callable[[RequestT], int]
    options: frozenset[str]
    complete: Callable[[Any], Any] = lambda body: body
    check: Callable[[Any], Any] = lambda request: None

    def check_options(self, options: Options) -> None:
        """An InvalidRequest naming the first option `options` sets that this surface does not
        read (only options set away from their defaults count)."""
        given = msgspec.to_builtins(options)  # omit_defaults: only what the request set
        stray = sorted(set(given) - self.options)
        if stray:
            field = f"options.{stray[0]}"
            raise InvalidRequest(
                f"{field}: not an option of {self.name} (it takes {', '.join(sorted(self.options))})",
                param=field,
            )

    def decode(self, value: Any) -> RequestT:
        """A request from decoded JSON, as strictly as the routes decode their bodies: a value
        must have the type the document gives it ("4" is not an integer, 0 not a boolean)."""
        try:
            request = msgspec.convert(value, type=self.request_type, strict=True)
        except msgspec.ValidationError:
            # JSON Schema's integer is any number without a fraction (2.0); msgspec's strict one
            # is not, so a value refused is tried again with those written as ints.
            request = msgspec.convert(whole_numbers(value), type=self.request_type, strict=True)
        self.check(request)
        return request


def whole_numbers(value: Any) -> Any:
    """Decoded JSON `value` with every float that has no fraction as an int (2.0 is 2): an
    integer to JSON Schema, which a strict msgspec decode takes only as an int."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [whole_numbers(v) for v in value]
    if isinstance(value, dict):
        return {k: whole_numbers(v) for k, v in value.items()}
    return value


class SurfaceRegistry:
    """Surfaces by name, in registration order; an unknown name is a 400 naming the known ones."""

    def __init__(self, *surfaces: Surface[Any]) -> None:
        self._by_name: dict[str, Surface[Any]] = {}
        for surface in surfaces:
            if surface.name in self._by_name:
                raise ValueError(f"surface {surface.name!r} is registered twice")
            self._by_name[surface.name] = surface

    def __iter__(self) -> Iterator[Surface[Any]]:
        return iter(self._by_name.values())

    def names(self) -> list[str]:
        return list(self._by_name)

    def get(self, name: str) -> Surface[Any]:
        surface = self._by_name.get(name)
        if surface is None:
            raise InvalidRequest(f"surface: {name!r} is not one of {', '.join(self._by_name)}")
        return surface

    def for_jobs(self, name: str) -> Surface[Any]:
        """The surface bulk jobs may run under `name`; a 400 if unknown or not taken in bulk."""
        surface = self.get(name)
        if not surface.bulk:
            bulk = ", ".join(s.name for s in self if s.bulk)
            raise InvalidRequest(f"surface: {name!r} does not take bulk jobs (those that do: {bulk})")
        return surface


def _chars(value: str | ClassifyItem | RerankDocument | list[Any]) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, ClassifyItem):
        parts = (value.text, value.text_pair, value.context, value.question, value.answer)
        return sum(len(p or "") for p in parts)
    if isinstance(value, RerankDocument):
        return len(value.text)
    return sum(_chars(v) for v in value)


def _state_chars(state: StateValue | None) -> int:
    """A text state's length, or an object state's JSON length."""
    if state is None:
        return 0
    return len(state) if isinstance(state, str) else len(msgspec.json.encode(state))


def _decision_chars(request: DecisionsRequest) -> int:
    return _state_chars(request.state) + sum(_state_chars(s.state) for s in (request.states or {}).values())


def complete_rerank(body: RerankResponse) -> RerankResponse:
    """Every answered result carries a `logit` (the router refuses a result without one): a
    family that reports none gets the score it ranks by, its `relevance_score`, so sorting by
    either gives the same order. A cross-encoder reports its own (the relevance logit); a
    bi-encoder's cosine is both its score and its logit."""
    for result in body.results:
        if result.logit is None and result.error is None and result.relevance_score is not None:
            result.logit = result.relevance_score
    return body


def finish(model: Any, plan: Any, results: list[Any]) -> Any:
    """`model.finish_surface(plan, results)`, completed by its surface's descriptor: the one
    way a response body is made, for requests and for bulk jobs alike."""
    return REGISTRY.get(plan.surface).complete(model.finish_surface(plan, results))


def _one_or_list(value: object) -> int:
    return len(value) if isinstance(value, list) else 1


CLASSIFY: Surface[ClassifyRequest] = Surface(
    name="classify",
    request_type=ClassifyRequest,
    response_type=ClassifyResponse,
    bulk=True,
    counted_field="input",
    count=lambda r: _one_or_list(r.input),
    text_chars=lambda r: _chars(r.input),
    options=CLASSIFY_OPTIONS,
    check=lambda r: texts_of(r.input),
)

EMBEDDINGS: Surface[EmbeddingsRequest] = Surface(
    name="embeddings",
    request_type=EmbeddingsRequest,
    response_type=EmbeddingsResponse,
    bulk=True,
    counted_field="input",
    count=lambda r: len(r.inputs()),
    text_chars=lambda r: sum(len(i) for i in r.inputs()),
    options=EMBEDDINGS_OPTIONS,
)

RERANK: Surface[RerankRequest] = Surface(
    name="rerank",
    request_type=RerankRequest,
    response_type=RerankResponse,
    bulk=True,
    counted_field="documents",
    count=lambda r: len(r.documents),
    text_chars=lambda r: len(r.query) + _chars(r.documents),
    options=RERANK_OPTIONS,
    complete=complete_rerank,
)

DECISIONS: Surface[DecisionsRequest] = Surface(
    name="decisions",
    request_type=DecisionsRequest,
    response_type=DecisionsResponse,
    bulk=True,
    counted_field="questions",
    count=count_questions,
    text_chars=_decision_chars,
    options=DECISIONS_OPTIONS,
)

# Every surface, in one place: the app routes requests to them, jobs decode their lines and
# golden checks decode their recorded requests from here.
REGISTRY = SurfaceRegistry(CLASSIFY, EMBEDDINGS, RERANK, DECISIONS)


def request_type(surface: str) -> type[Any]:
    """The request Struct of a surface (for bulk job lines and recorded golden requests)."""
    return REGISTRY.get(surface).request_type
