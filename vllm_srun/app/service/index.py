"""GET /: what this server is and where to go next, in a small JSON body. It is also TEI's
Inference API health route, so its status is /health's: 200 once every model is ready, else
503 with the same body. Public, like /health; where API keys are configured, a request without
a valid key is not told the version.
"""

from __future__ import annotations

import msgspec
from litestar import Response, get
from litestar.datastructures import State
from litestar.openapi import ResponseSpec

from vllm_srun import __version__, defaults
from vllm_srun.app.runtime import Runtime
from vllm_srun.app.service.health import Status, model_states, overall
from vllm_srun.app.tenants import CALLER

NAME = "vllm-srun"


class ServerLinks(msgspec.Struct):
    """Where this server's pages and first routes are, as paths on it: the API reference, the
    page to try a request on, the OpenAPI document, the served models, readiness."""

    docs: str
    try_it: str
    openapi: str
    models: str
    health: str


LINKS = ServerLinks(
    docs="/docs", try_it="/docs/swagger", openapi="/openapi.json", models="/v1/models", health="/health"
)


class ServerIndex(msgspec.Struct):
    """The server's name and version (null for a caller without a key where keys are
    configured), the router contract's version it speaks, /health's status, and `links`."""

    name: str
    version: str | None
    api_version: str
    status: Status
    links: ServerLinks


@get(
    "/",
    summary="This server: its name, version, status, and where its docs, models and health are",
    # The operationId this path has had since it was TEI's health route alone.
    operation_id="RootHealth",
    opt={"public": True},
    responses={
        503: ResponseSpec(ServerIndex, description="Not ready: the same body", generate_examples=False)
    },
)
async def index(state: State) -> Response[ServerIndex]:
    runtime: Runtime = state.runtime
    status, _ = overall(await model_states(runtime))
    told = not runtime.callers or CALLER.get() is not None
    version = __version__ if told else None
    body = ServerIndex(
        name=NAME, version=version, api_version=defaults.API_VERSION, status=status, links=LINKS
    )
    return Response(body, status_code=200 if status == "ready" else 503)
