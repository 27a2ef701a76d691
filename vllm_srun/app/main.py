"""The Litestar app: routes, the lifespan that owns the runtime, and the request edge.

The edge middleware times every request, records it in the metrics, logs it (never its
text) and makes sure every response carries `Server-Timing`.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import structlog
from litestar import Litestar, Request, Response, get
from litestar.connection import ASGIConnection
from litestar.datastructures import State
from litestar.handlers import HTTPRouteHandler
from litestar.handlers.base import BaseRouteHandler
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from vllm_srun import __version__, defaults, tracing
from vllm_srun.app.docs import openapi_config
from vllm_srun.app.errors import ERROR_RESPONSES, EXCEPTION_HANDLERS
from vllm_srun.app.health import health, live
from vllm_srun.app.jobs import job_routes
from vllm_srun.app.metrics import metrics
from vllm_srun.app.models import list_models, retrieve_model
from vllm_srun.app.responses import TIMING_KEY
from vllm_srun.app.routes.bundle import bundle
from vllm_srun.app.routes.infinity import infinity_health, infinity_models
from vllm_srun.app.routes.tei_info import info as tei_info
from vllm_srun.app.routes.tei_root import invocations as tei_invocations
from vllm_srun.app.routes.tei_root import ping as tei_ping
from vllm_srun.app.routes.tei_root import root as tei_root
from vllm_srun.app.routes.tei_root import root_health as tei_root_health
from vllm_srun.app.routes.tei_root import root_options as tei_root_options
from vllm_srun.app.routes.tei_shared import TEI_RESPONSES, TeiError
from vllm_srun.app.routes.tei_tokenize import decode as tei_decode
from vllm_srun.app.routes.tei_tokenize import tokenize as tei_tokenize
from vllm_srun.app.runtime import Runtime
from vllm_srun.app.schemas import StrictStructSchemaPlugin
from vllm_srun.app.serving import Timing
from vllm_srun.app.settings import ServerSettings
from vllm_srun.app.strict import strict_body
from vllm_srun.app.tenants import CALLER
from vllm_srun.app.yaml_document import openapi_yaml_text
from vllm_srun.errors import SrunError, Unauthorized
from vllm_srun.plugins.surfaces import REGISTRY, SurfaceRegistry

log = structlog.get_logger("vllm_srun.http")


def surface_routes(registry: SurfaceRegistry = REGISTRY) -> list[HTTPRouteHandler]:
    """The controller of every route of every surface, each checked to be mounted where its
    descriptor says (a controller at another path would serve, and count, the wrong route)."""
    handlers = []
    for surface in registry:
        for route in surface.routes:
            module, _, attribute = route.handler.partition(":")
            handler = getattr(importlib.import_module(module), attribute)
            if not isinstance(handler, HTTPRouteHandler) or set(handler.paths) != {route.path}:
                raise TypeError(f"{route.handler} is not a route handler at {route.path} ({surface.name})")
            handlers.append(handler)
    return handlers


# text-embeddings-inference's routes that reach no one surface: its model info, tokenizer,
# the model's own route (POST / and SageMaker's /invocations, by the model's kind) and its
# health routes (GET /, /ping); /embed, /predict, /rerank... are adapters on their surfaces'
# descriptors.
TEI_ROUTES = [
    tei_info,
    tei_tokenize,
    tei_decode,
    tei_root_options,  # first: see its docstring
    tei_root,
    tei_invocations,
    tei_root_health,
    tei_ping,
]

# The runtime's own routes; the surfaces' come from their descriptors and the jobs' take a
# body limit that is a setting, so `create_app` adds both.
OWN_ROUTES = [
    list_models,
    retrieve_model,
    health,
    live,
    metrics,
    bundle,
    *TEI_ROUTES,
    infinity_models,
    infinity_health,
]


def documented(handlers: list[HTTPRouteHandler]) -> list[HTTPRouteHandler]:
    """`handlers`, each listing in the OpenAPI document the error body of every status its
    exception handlers answer: TEI's on the routes that answer in TEI's shape, the app's own
    elsewhere (both replace Litestar's `{status_code, detail}`, which this app never sends).
    A response a handler declares itself (a 503 with another body) is kept."""
    for handler in handlers:
        tei = TeiError in (handler.exception_handlers or {})
        handler.responses = {**(TEI_RESPONSES if tei else ERROR_RESPONSES), **(handler.responses or {})}
    return handlers


def surface_paths(registry: SurfaceRegistry = REGISTRY) -> dict[str, str]:
    """The metrics label of each surface route: its surface's name (/v1/systemone counts as
    decisions); a bundle counts as `bundle`, under no one model (its tasks may name several)."""
    return {**{path: surface.name for path, surface in registry.by_path().items()}, "/v1/bundle": "bundle"}


def _edge(surface_of_path: dict[str, str]) -> Callable[[ASGIApp], ASGIApp]:
    """The request edge, labelling requests on a surface route by `surface_of_path`."""
    return partial(_edge_middleware, surface_of_path=surface_of_path)


def _edge_middleware(app: ASGIApp, *, surface_of_path: dict[str, str]) -> ASGIApp:
    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500
        # The handler fills in its phases; the header is written as the response starts, so an
        # error answered by an exception handler carries the phases reached too.
        timing = scope.setdefault("state", {})[TIMING_KEY] = Timing(started=started)

        async def timed_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", []))
                if not any(name.lower() == b"server-timing" for name, _ in headers):
                    value = timing.header(body_parse=scope.get("method") in ("POST", "PUT", "PATCH"))
                    headers.append((b"server-timing", value.encode()))
                    message["headers"] = headers
            await send(message)

        # The request's span; a caller's `traceparent` header makes it part of the caller's trace.
        surface = surface_of_path.get(scope["path"])
        try:
            with _request_span(scope, surface) as request_span:
                try:
                    await app(scope, receive, timed_send)
                finally:
                    request_span.set(**{"http.response.status_code": status})
        finally:
            latency_s = time.perf_counter() - started
            runtime: Runtime | None = getattr(scope["app"].state, "runtime", None)
            if surface and runtime is not None:
                # The model is known once the body decoded; a malformed request counts under "".
                model = scope.get("state", {}).get("srun_model", "")
                runtime.stats.record_request(model=model, surface=surface, status=status, latency_s=latency_s)
            # A log line per request is a real share of the event loop under load: errors
            # always, successes only with --log-level debug.
            (log.info if status >= 400 else log.debug)(
                "request",
                method=scope["method"],
                path=scope["path"],
                status=status,
                ms=round(latency_s * 1000, 3),
            )

    return middleware


def _request_span(scope: Scope, surface: str | None) -> Any:
    """The span of one HTTP request: named by its route when it is a surface's (a bounded set of
    names, as OpenTelemetry's HTTP conventions ask), else by its method alone."""
    if not tracing.ON:  # no header scan for a process that does not trace
        return tracing.span("")
    method = str(scope.get("method", ""))
    headers = {
        name.decode("latin-1"): value.decode("latin-1")
        for name, value in scope.get("headers", [])
        if name in (b"traceparent", b"tracestate")
    }
    attributes: dict[str, Any] = {
        "http.request.method": method,
        "url.path": scope["path"],
        "surface": surface,
    }
    return tracing.span(
        f"{method} {scope['path']}" if surface else method,
        kind="server",
        parent=tracing.extract(headers),
        **attributes,
    )


async def _api_key_guard(connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler) -> None:
    # async: Litestar runs a sync guard in a worker thread, a thread hop on every request.
    # The caller is set for every request (None first): a handler never sees another's.
    CALLER.set(None)
    runtime: Runtime | None = getattr(connection.app.state, "runtime", None)
    if runtime is None or not runtime.callers:
        return
    given = connection.headers.get("authorization", "")
    token = given[7:] if given.lower().startswith("bearer ") else connection.headers.get("x-api-key", "")
    caller = runtime.callers.identify(token) if token else None
    if handler.opt.get("public"):  # answered without a key; a key given still identifies (/health's detail)
        CALLER.set(caller)
        return
    if caller is None:
        raise Unauthorized("a valid API key is required (Authorization: Bearer KEY)")
    CALLER.set(caller)


def stop_serving(app: Litestar, grace_s: float) -> None:
    """Called as the server stops taking connections: see `Runtime.stopping`."""
    runtime: Runtime | None = getattr(app.state, "runtime", None)
    if runtime is not None:
        runtime.stopping(grace_s)


@get("/openapi.json", summary="The OpenAPI document", include_in_schema=False)
async def openapi_document(request: Request[Any, Any, Any]) -> dict[str, Any]:
    return request.app.openapi_schema.to_schema()


@get("/openapi.yaml", summary="The OpenAPI document as YAML", include_in_schema=False)
async def openapi_yaml(request: Request[Any, Any, Any]) -> Response[str]:
    """The same document as /openapi.json, in YAML: where the router's dashboard probes for it."""
    return Response(openapi_yaml_text(request.app), media_type="application/yaml")


def create_app(settings: ServerSettings | None = None, *, surfaces: SurfaceRegistry = REGISTRY) -> Litestar:
    """The app. Without settings it has routes but no runtime: enough for the OpenAPI document.

    It mounts every route of every surface in `surfaces` (by default all of them)."""

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        if settings is None:
            yield
            return
        try:
            runtime = await Runtime.start(settings)
        except SrunError as exc:
            app.state.startup_error = exc.message
            raise
        app.state.runtime = runtime
        try:
            yield
        finally:
            await runtime.close()

    max_job_bytes = settings.max_job_bytes if settings else ServerSettings.max_job_bytes
    return Litestar(
        route_handlers=[
            *documented([*surface_routes(surfaces), *OWN_ROUTES, *job_routes(max_job_bytes)]),
            openapi_document,
            openapi_yaml,
        ],
        lifespan=[lifespan],
        exception_handlers=EXCEPTION_HANDLERS,
        middleware=[_edge(surface_paths(surfaces))],
        guards=[_api_key_guard],
        before_request=strict_body,
        state=State({}),
        request_max_body_size=settings.max_request_bytes if settings else defaults.MAX_REQUEST_BYTES,
        openapi_config=openapi_config("vllm-srun", __version__, api_version=defaults.API_VERSION),
        plugins=[StrictStructSchemaPlugin()],
        logging_config=None,
        debug=False,
    )
