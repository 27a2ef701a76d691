"""The shared tail of every surface controller: serve, encode, and fill in Server-Timing."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec
from litestar import MediaType, Request, Response
from litestar.datastructures import State

from vllm_srun.app.runtime import Runtime
from vllm_srun.app.serving import Timing, serve_surface
from vllm_srun.plugins.surfaces import Surface, SurfaceRequest

T = TypeVar("T")

# The scope-state key of a request's Timing (set by the request edge, filled by the handler).
TIMING_KEY = "srun_timing"


def timing_of(request: Request[Any, Any, Any]) -> Timing:
    """The request's Timing, marked parsed: its handler runs now, so the body is decoded."""
    state = request.scope["state"]
    timing = state.get(TIMING_KEY)
    if not isinstance(timing, Timing):  # an app without the edge (never in a served app)
        timing = state[TIMING_KEY] = Timing()
    timing.parsed()
    return timing


def label_model(request: Request[Any, Any, Any], runtime: Runtime, model: str | None) -> None:
    """The metrics label of the request: only a served model's name (a client's unknown name
    would add series for good); a request that names none is labelled by the model it runs
    on, if only one."""
    if model is None and len(runtime.models) == 1:
        model = next(iter(runtime.models))
    served = runtime.serving.find(model) if model is not None else None
    request.scope["state"]["srun_model"] = served.name if served is not None else ""


def encoded(body: Any, timing: Timing, *, status_code: int = 200) -> Response[Any]:
    """`body` as a JSON response, its encoding timed as the `serialize` phase."""
    started = time.perf_counter()
    content = msgspec.json.encode(body)
    timing.serialize_s = time.perf_counter() - started
    return Response(content, status_code=status_code, media_type=MediaType.JSON)


def client_closed() -> Response[Any]:
    """What a request whose client left is logged as (the client never reads it)."""
    return Response({"error": {"code": "client_closed", "message": "the client disconnected"}}, status_code=499)


async def unless_disconnected(request: Request[Any, Any, Any], work: Awaitable[T]) -> tuple[bool, T | None]:
    """(True, the result of `work`), or (False, None) when the client left first: the work is
    then cancelled, which takes its items out of the queue.

    `work` runs in the caller's task, not a task of its own: work that never waits (a request
    whose results are all stored) is answered without waiting for a turn of the event loop,
    which under load runs every other request's step first. The watch cancels the caller."""
    caller = asyncio.current_task()
    assert caller is not None
    left = False

    def on_gone(watch: asyncio.Future[None]) -> None:
        nonlocal left
        if not watch.cancelled():
            watch.exception()  # retrieved: a failed watch counts as gone, as the client is
            left = True
            caller.cancel()

    gone = asyncio.ensure_future(_disconnected(request))
    gone.add_done_callback(on_gone)
    try:
        result = await work
    except asyncio.CancelledError:
        if not left:
            raise
        caller.uncancel()
        return False, None
    finally:
        gone.remove_done_callback(on_gone)
        gone.cancel()
    if left:  # the client left as the work ended, and the work kept its result through the cancel
        caller.uncancel()
        return False, None
    return True, result


async def respond(
    request: Request[Any, Any, Any],
    state: State,
    surface: Surface[Any],
    data: SurfaceRequest,
    *,
    shape: Callable[[Any], Any] | None = None,
) -> Response[Any]:
    """Serve `data` on `surface` and answer it; `shape` turns the surface's response body into
    a route's own (an adapter route in another API's shape), by default it is sent as is. A
    `shape` may be a coroutine function (Cohere's quantized types wait on a calibration)."""
    timing = timing_of(request)
    runtime: Runtime = state.runtime
    label_model(request, runtime, data.model)

    async def work() -> Any:
        body = await serve_surface(runtime, surface, data, timing)
        if shape is None:
            return body
        shaped = shape(body)
        return await shaped if inspect.isawaitable(shaped) else shaped

    done, body = await unless_disconnected(request, work())
    if not done:
        return client_closed()
    return encoded(body, timing)


async def _disconnected(request: Request[Any, Any, Any]) -> None:
    """Returns when the client closes the connection (the body has already been read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
