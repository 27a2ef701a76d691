"""The app's surface routes come from its route table (`vllm_srun.app.routes`), and nowhere else.

In process, without a runtime: every surface's own route is mounted with the descriptor's
request and response types, the metrics label of each path is its surface, a path listed
twice is refused, and a route in another API's shape is one module plus one table entry.
"""

from __future__ import annotations

import json
import sys
import typing
from pathlib import Path

import pytest
from litestar import Response
from litestar.handlers import HTTPRouteHandler

from vllm_srun.app.main import create_app
from vllm_srun.app.routes import BUNDLE_ROUTES, SURFACE_ROUTES, surface_paths
from vllm_srun.plugins.surfaces import DECISIONS, REGISTRY


def _types(handler: HTTPRouteHandler) -> tuple[object, object]:
    hints = typing.get_type_hints(handler.fn)
    returned = hints["return"]
    assert typing.get_origin(returned) is Response
    return hints["data"], typing.get_args(returned)[0]


def test_every_surface_route_is_mounted_and_its_own_has_its_types() -> None:
    app = create_app()
    mounted = {route.path for route in app.routes}
    assert list(SURFACE_ROUTES) == REGISTRY.names(), "every surface has routes, none other"
    for surface in REGISTRY:
        handlers = SURFACE_ROUTES[surface.name]
        for handler in handlers:
            assert handler.paths <= mounted, handler.paths
        # Its own route, /v1/<name>, is listed first, and takes and answers its types; an
        # adapter (TEI's /embed...) its API's.
        own = handlers[0]
        assert own.paths == {f"/v1/{surface.name}"}, "a surface's own route is /v1/<name>"
        data, response = _types(own)
        assert data is surface.request_type and response is surface.response_type, surface.name


def test_metrics_label_of_each_path_is_its_surface() -> None:
    assert surface_paths({**SURFACE_ROUTES, **BUNDLE_ROUTES}) == {
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


def test_a_path_listed_twice_is_refused() -> None:
    """Moved here from tests/plugins/test_surfaces.py with the routes: a path listed under two
    surfaces (or twice under one) would count its requests under one of them only."""
    routes = {**SURFACE_ROUTES, "rerank": (*SURFACE_ROUTES["rerank"], SURFACE_ROUTES["classify"][0])}
    with pytest.raises(ValueError, match=r"/v1/classify is listed under 'classify' and 'rerank'"):
        surface_paths(routes)
    with pytest.raises(ValueError, match="/v1/rerank"):
        create_app(routes={**SURFACE_ROUTES, "rerank": SURFACE_ROUTES["rerank"] * 2})


def test_systemone_is_the_second_route_of_decisions() -> None:
    """Moved here from tests/plugins/test_surfaces.py with the routes."""
    assert [next(iter(h.paths)) for h in SURFACE_ROUTES["decisions"]] == ["/v1/decisions", "/v1/systemone"]
    assert surface_paths(SURFACE_ROUTES)["/v1/systemone"] == DECISIONS.name
    # With the peers' routes: TEI's, Cohere's (rerank, and embed on /v1 and /v2), vLLM's (and
    # under /vllm) and Infinity's (/infinity).
    assert len(surface_paths(SURFACE_ROUTES)) == 30


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


def test_a_route_in_another_shape_is_one_module_and_one_table_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "tei_embed_route.py").write_text(TEI_EMBED)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "tei_embed_route", raising=False)
    # The one registration line: a second handler on the embeddings surface in the table.
    from tei_embed_route import embed  # type: ignore[import-not-found]

    routes = {**SURFACE_ROUTES, "embeddings": (SURFACE_ROUTES["embeddings"][0], embed)}
    app = create_app(routes=routes)
    assert "/embed" in {route.path for route in app.routes}
    assert surface_paths(routes)["/embed"] == "embeddings"
    document = json.loads(json.dumps(app.openapi_schema.to_schema()))
    body = document["paths"]["/embed"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["$ref"].endswith("/EmbedRequest")
    assert surface_paths(SURFACE_ROUTES)["/embed"] == "embeddings", (
        "the real TEI route is listed the same way"
    )
