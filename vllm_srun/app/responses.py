"""The shared tail of every surface controller: serve, then add Server-Timing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from litestar import Request, Response
from litestar.datastructures import State

from vllm_srun.app.runtime import Runtime
from vllm_srun.app.serving import Timing, serve_surface
from vllm_srun.plugins.surfaces import Surface, SurfaceRequest


async def respond(
    request: Request[Any, Any, Any],
    state: State,
    surface: Surface[Any],
    data: SurfaceRequest,
    *,
    shape: Callable[[Any], Any] | None = None,
) -> Response[Any]:
    """Serve `data` on `surface` and answer it; `shape` turns the surface's response body into
    a route's own (an adapter route in another API's shape), by default it is sent as is."""
    runtime: Runtime = state.runtime
    timing = Timing()
    # The metrics label: only a served model's name (a client's unknown name would add series
    # for good); a request that names none is labelled by the model it runs on, if only one.
    model = data.model
    if model is None and len(runtime.models) == 1:
        model = next(iter(runtime.models))
    served = runtime.serving.find(model) if model is not None else None
    request.scope["state"]["srun_model"] = served.name if served is not None else ""
    work = asyncio.ensure_future(serve_surface(runtime, surface, data, timing))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not work.done():
        # The client left: cancelling the work takes its items out of the queue.
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work
        return Response(
            {"error": {"code": "client_closed", "message": "the client disconnected"}}, status_code=499
        )
    body = work.result() if shape is None else shape(work.result())
    return Response(body, headers={"Server-Timing": timing.header()})


async def _disconnected(request: Request[Any, Any, Any]) -> None:
    """Returns when the client closes the connection (the body has already been read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
