"""The app's surface routes come from the surface descriptors, and nowhere else.

In process, without a runtime: every descriptor route is mounted with the descriptor's
request and response types, the metrics label of each path is its surface, a controller at
the wrong path is refused, and a route in another API's shape is one module plus one `Route`.
"""

from __future__ import annotations

import json
import sys
import typing
from dataclasses import replace
from pathlib import Path

import pytest
from litestar import Response
from litestar.handlers import HTTPRouteHandler

from vllm_srun.app.main import create_app, surface_paths, surface_routes
from vllm_srun.plugins.surfaces import (
    CLASSIFY,
    DECISIONS,
    EMBEDDINGS,
    REGISTRY,
    RERANK,
    Route,
    SurfaceRegistry,
)


def _types(handler: HTTPRouteHandler) -> tuple[object, object]:
    hints = typing.get_type_hints(handler.fn)
    returned = hints["return"]
    assert typing.get_origin(returned) is Response
    return hints["data"], typing.get_args(returned)[0]


def test_every_descriptor_route_is_mounted_with_its_types() -> None:
    app = create_app()
    mounted = {route.path for route in app.routes}
    handlers = {next(iter(handler.paths)): handler for handler in surface_routes()}
    for surface in REGISTRY:
        for route in surface.routes:
            assert route.path in mounted, route
        # Its own route takes and answers its types; an adapter (TEI's /embed...) its API's.
        data, response = _types(handlers[surface.path])
        assert data is surface.request_type and response is surface.response_type, surface.name


def test_metrics_label_of_each_path_is_its_surface() -> None:
    assert surface_paths() == {
        "/v1/classify": "classify",
        "/predict": "classify",
        "/classify": "classify",
        "/vllm/classify": "classify",
        "/infinity/classify": "classify",
        "/v1/embeddings": "embeddings",
        "/embed": "embeddings",
        "/embed_sparse": "embeddings",
        "/embed_all": "embeddings",
        "/similarity": "embeddings",
        "/embeddings": "embeddings",
        "/infinity/embeddings": "embeddings",
        "/vllm/embeddings": "embeddings",
        "/vllm/v1/embeddings": "embeddings",
        "/pooling": "embeddings",
        "/vllm/pooling": "embeddings",
        "/v1/embed": "embeddings",
        "/v2/embed": "embeddings",
        "/v1/rerank": "rerank",
        "/rerank": "rerank",
        "/v2/rerank": "rerank",
        "/vllm/rerank": "rerank",
        "/vllm/v1/rerank": "rerank",
        "/infinity/rerank": "rerank",
        "/score": "rerank",
        "/v1/score": "rerank",
        "/vllm/score": "rerank",
        "/vllm/v1/score": "rerank",
        "/v1/decisions": "decisions",
        "/v1/systemone": "decisions",
        "/v1/bundle": "bundle",
    }


def test_a_controller_at_another_path_is_refused() -> None:
    wrong = replace(RERANK, routes=(Route("/v1/rerank", "vllm_srun.app.routes.classify:classify"),))
    with pytest.raises(TypeError, match=r"classify:classify is not a route handler at /v1/rerank"):
        surface_routes(SurfaceRegistry(CLASSIFY, wrong))
    with pytest.raises(AttributeError):
        surface_routes(
            SurfaceRegistry(replace(RERANK, routes=(Route("/v1/rerank", "vllm_srun.app.main:nope"),)))
        )


# A route in another API's shape onto an existing surface: TEI's POST /embed, as a test module.
TEI_EMBED = """
from typing import Any

import msgspec
from litestar import Request, Response, post
from litestar.datastructures import State
from litestar.params import JSONBody

from vllm_srun.app.responses import respond
from vllm_srun.plugins.surfaces import EMBEDDINGS, EmbeddingsRequest, EmbeddingsResponse


class EmbedRequest(msgspec.Struct, forbid_unknown_fields=True):
    inputs: str | list[str]


def _vectors(body: EmbeddingsResponse) -> list[Any]:
    return [item.embedding for item in body.data]


@post("/embed", status_code=200, summary="Embed texts (TEI-compatible)")
async def embed(request: Request[Any, Any, Any], data: JSONBody[EmbedRequest], state: State) -> Response[list[list[float]]]:
    converted = EmbeddingsRequest(input=data.inputs)
    return await respond(request, state, EMBEDDINGS, converted, shape=_vectors)
"""


def test_a_route_in_another_shape_is_one_module_and_one_route(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "tei_embed_route.py").write_text(TEI_EMBED)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "tei_embed_route", raising=False)
    # The one registration line: a second Route on the embeddings descriptor.
    embeddings = replace(EMBEDDINGS, routes=(EMBEDDINGS.routes[0], Route("/embed", "tei_embed_route:embed")))
    registry = SurfaceRegistry(CLASSIFY, embeddings, RERANK, DECISIONS)
    app = create_app(surfaces=registry)
    assert "/embed" in {route.path for route in app.routes}
    assert surface_paths(registry)["/embed"] == "embeddings"
    document = json.loads(json.dumps(app.openapi_schema.to_schema()))
    body = document["paths"]["/embed"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["$ref"].endswith("/EmbedRequest")
    assert surface_paths()["/embed"] == "embeddings", "the real TEI route is registered the same way"
