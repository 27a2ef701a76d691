"""The Litestar app: routes, the lifespan that owns the runtime, and the request edge.

The edge middleware times every request, records it in the metrics, logs it (never its
text) and makes sure every response carries `Server-Timing`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import structlog
from litestar import Litestar, Request, get
from litestar.connection import ASGIConnection
from litestar.datastructures import State
from litestar.handlers import HTTPRouteHandler
from litestar.handlers.base import BaseRouteHandler
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from vllm_srun import __version__, defaults, tracing
from vllm_srun.app.docs import PUBLIC, openapi_config, secured
from vllm_srun.app.errors import ERROR_RESPONSES, EXCEPTION_HANDLERS
from vllm_srun.app.peers.openai_batch.batches import BATCH_ROUTES
from vllm_srun.app.peers.openai_batch.files import file_routes
from vllm_srun.app.peers.router import openapi_yaml
from vllm_srun.app.peers.tei.errors import TEI_RESPONSES, TeiError
from vllm_srun.app.responses import TIMING_KEY
from vllm_srun.app.routes import BUNDLE_ROUTES, PEER_ROUTES, SURFACE_ROUTES, TAGS, surface_paths, tagged
from vllm_srun.app.runtime import Runtime
from vllm_srun.app.schemas import StrictStructSchemaPlugin
from vllm_srun.app.service.health import health, live
from vllm_srun.app.service.index import NAME, index
from vllm_srun.app.service.jobs import job_routes
from vllm_srun.app.service.metrics import metrics
from vllm_srun.app.service.model_cards import ROUTES_KEY, list_models, retrieve_model
from vllm_srun.app.serving import Timing
from vllm_srun.app.settings import ServerSettings
from vllm_srun.app.strict import strict_body
from vllm_srun.app.tenants import CALLER
from vllm_srun.errors import SrunError, Unauthorized

log = structlog.get_logger("vllm_srun.http")


# The runtime's own routes; the jobs' take a body limit that is a setting, so `create_app`
# adds them.
SERVICE_ROUTES = [list_models, retrieve_model, health, live, metrics]


def documented(handlers: list[HTTPRouteHandler]) -> list[HTTPRouteHandler]:
    """`handlers`, each listing in the OpenAPI document the error body of every status its
    exception handlers answer: TEI's on the routes that answer in TEI's shape, the app's own
    elsewhere (both replace Litestar's `{status_code, detail}`, which this app never sends).
    A response a handler declares itself (a 503 with another body) is kept."""
    for handler in handlers:
        tei = TeiError in (handler.exception_handlers or {})
        handler.responses = {**(TEI_RESPONSES if tei else ERROR_RESPONSES), **(handler.responses or {})}
    return handlers


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


@get("/openapi.json", summary="The OpenAPI document", include_in_schema=False, opt=PUBLIC)
async def openapi_document(request: Request[Any, Any, Any]) -> dict[str, Any]:
    return request.app.openapi_schema.to_schema()


def create_app(
    settings: ServerSettings | None = None,
    *,
    routes: dict[str, tuple[HTTPRouteHandler, ...]] = SURFACE_ROUTES,
) -> Litestar:
    """The app. Without settings it has routes but no runtime: enough for the OpenAPI document.

    It mounts every route in `routes` (each surface's, by default `SURFACE_ROUTES`) and the rest."""

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
    surface_of_path = surface_paths({**routes, **BUNDLE_ROUTES})
    handlers = [
        *(handler for handlers in routes.values() for handler in handlers),
        *SERVICE_ROUTES,
        *BUNDLE_ROUTES["bundle"],
        *PEER_ROUTES,
        index,  # after the peers': OPTIONS / must be registered first (tei_root.root_options)
        *job_routes(max_job_bytes),
        *file_routes(max_job_bytes),
        *BATCH_ROUTES,
    ]
    # A server with keys marks each operation its guard guards; one without takes every request
    # without a key, and its document says so by marking none.
    keyed = settings is not None and bool(settings.api_key or settings.api_keys)
    described = documented(tagged(handlers))
    return Litestar(
        route_handlers=[*(secured(described) if keyed else described), openapi_document, openapi_yaml],
        lifespan=[lifespan],
        exception_handlers=EXCEPTION_HANDLERS,
        middleware=[_edge(surface_of_path)],
        guards=[_api_key_guard],
        before_request=strict_body,
        state=State({ROUTES_KEY: surface_paths(routes)}),
        request_max_body_size=settings.max_request_bytes if settings else defaults.MAX_REQUEST_BYTES,
        openapi_config=openapi_config(NAME, __version__, api_version=defaults.API_VERSION, tags=TAGS),
        plugins=[StrictStructSchemaPlugin()],
        logging_config=None,
        debug=False,
    )
