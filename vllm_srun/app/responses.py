"""The shared tail of every surface controller: serve, then add Server-Timing."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from litestar import Request, Response
from litestar.datastructures import State

from vllm_srun.app.runtime import Runtime
from vllm_srun.app.serving import Timing, serve_surface


async def respond(request: Request[Any, Any, Any], state: State, surface: str, data: Any) -> Response[Any]:
    runtime: Runtime = state.runtime
    timing = Timing()
    # The metrics label: only a served model's name (a client's unknown name would add series
    # for good); a request that names none is labelled by the model it runs on, if only one.
    model = data.model
    if model is None and len(runtime.models) == 1:
        model = next(iter(runtime.models))
    request.scope["state"]["srun_model"] = model if model in runtime.models else ""
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
    return Response(work.result(), headers={"Server-Timing": timing.header()})


async def _disconnected(request: Request[Any, Any, Any]) -> None:
    """Returns when the client closes the connection (the body has already been read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
