"""The Litestar app: routes, the lifespan that owns the runtime, and the request edge.

The edge middleware times every request, records it in the metrics, logs it (never its
text) and makes sure every response carries `Server-Timing`.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import structlog
from litestar import Litestar, Request, get
from litestar.connection import ASGIConnection
from litestar.datastructures import State
from litestar.handlers.base import BaseRouteHandler
from litestar.openapi import OpenAPIConfig
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from vllm_srun import __version__
from vllm_srun.app.classify import classify
from vllm_srun.app.decisions import decisions, systemone
from vllm_srun.app.embeddings import embeddings
from vllm_srun.app.errors import EXCEPTION_HANDLERS
from vllm_srun.app.health import health, live
from vllm_srun.app.jobs import job_routes
from vllm_srun.app.metrics import metrics
from vllm_srun.app.models import list_models
from vllm_srun.app.rerank import rerank
from vllm_srun.app.runtime import Runtime, ServerSettings
from vllm_srun.errors import SrunError, Unauthorized

log = structlog.get_logger("vllm_srun.http")

ROUTES = [classify, embeddings, rerank, decisions, systemone, list_models, health, live, metrics]
SURFACE_PATHS = {
    "/v1/classify": "classify",
    "/v1/embeddings": "embeddings",
    "/v1/rerank": "rerank",
    "/v1/decisions": "decisions",
    "/v1/systemone": "decisions",
}


def _edge(app: ASGIApp) -> ASGIApp:
    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def timed_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", []))
                if not any(name.lower() == b"server-timing" for name, _ in headers):
                    total_ms = (time.perf_counter() - started) * 1000
                    headers.append((b"server-timing", f"total;dur={total_ms:.3f}".encode()))
                    message["headers"] = headers
            await send(message)

        try:
            await app(scope, receive, timed_send)
        finally:
            latency_s = time.perf_counter() - started
            surface = SURFACE_PATHS.get(scope["path"])
            runtime: Runtime | None = getattr(scope["app"].state, "runtime", None)
            if surface and runtime is not None:
                # The model is known once the body decoded; a malformed request counts under "".
                model = scope.get("state", {}).get("srun_model", "")
                runtime.stats.record_request(model=model, surface=surface, status=status, latency_s=latency_s)
            # One line per request costs ~5% of the event loop at a few hundred requests/s:
            # errors always, successes with --log-level debug.
            (log.info if status >= 400 else log.debug)(
                "request",
                method=scope["method"],
                path=scope["path"],
                status=status,
                ms=round(latency_s * 1000, 3),
            )

    return middleware


async def _api_key_guard(connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler) -> None:
    # async: Litestar runs a sync guard in a worker thread, a thread hop on every request.
    runtime: Runtime | None = getattr(connection.app.state, "runtime", None)
    key = runtime.settings.api_key if runtime is not None else None
    if not key or handler.opt.get("public"):
        return
    given = connection.headers.get("authorization", "")
    token = given[7:] if given.lower().startswith("bearer ") else connection.headers.get("x-api-key", "")
    if not hmac.compare_digest(token.encode(), key.encode()):
        raise Unauthorized("a valid API key is required (Authorization: Bearer KEY)")


@get("/openapi.json", summary="The OpenAPI document", include_in_schema=False)
async def openapi_document(request: Request[Any, Any, Any]) -> dict[str, Any]:
    return request.app.openapi_schema.to_schema()


def create_app(settings: ServerSettings | None = None) -> Litestar:
    """The app. Without settings it has routes but no runtime: enough for the OpenAPI document."""

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
        route_handlers=[*ROUTES, *job_routes(max_job_bytes), openapi_document],
        lifespan=[lifespan],
        exception_handlers=EXCEPTION_HANDLERS,
        middleware=[_edge],
        guards=[_api_key_guard],
        state=State({}),
        request_max_body_size=settings.max_request_bytes if settings else 4 * 1024 * 1024,
        openapi_config=OpenAPIConfig(title="vllm-srun", version=__version__, path="/docs"),
        logging_config=None,
        debug=False,
    )
