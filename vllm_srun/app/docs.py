"""The documentation pages, served whole from the package: /docs (Redoc, the reference) and
/docs/swagger (Swagger UI, to try a request), each linking the other, their scripts and styles
under /docs/static (vendored, pinned: `vendored/README.md`), never from a CDN. Every response
under /docs carries `CSP`: scripts only from this server and none inline, no other origin for
anything. The pages, their assets and the document answer without an API key (they describe
the API, no caller's data); each guarded operation declares the key (`BEARER`) for Swagger UI.
Also the OpenAPI config, and `operation_ids` for a controller mounted at several paths.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from litestar import Request, Router
from litestar.datastructures import ResponseHeader
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import (
    JsonRenderPlugin,
    OpenAPIRenderPlugin,
    RedocRenderPlugin,
    SwaggerRenderPlugin,
    YamlRenderPlugin,
)
from litestar.openapi.spec import Components, Info, OpenAPI, SecurityScheme, Tag
from litestar.static_files import create_static_files_router
from litestar.types.callable_types import OperationIDCreator

# The router's dashboard recognises a model engine by its document: this title exactly, and an
# info.version equal to /health's api_version (the contract's version), so those two are the
# contract's, and our own name and version go in info.description and `x-vllm-srun`.
ROUTER_TITLE = "vLLM Semantic Router Model Runtime"
RUNTIME_FIELD = "x-vllm-srun"
# The security scheme of every operation the API-key guard guards (`secured`): Swagger UI's
# Authorize sends its value as `Authorization: Bearer KEY`.
BEARER = "bearer"
PUBLIC = {"public": True}  # a handler's `opt`: the API-key guard lets it through without a key
VENDORED_DIR = Path(__file__).parent / "vendored"
STATIC_PATH = "/docs/static"
SWAGGER_UI_VERSION = "5.18.2"
REDOC_VERSION = "2.5.0"
CSP = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        "font-src 'self' data:",
        "connect-src 'self'",
        "worker-src 'self' blob:",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
)


# A line above each page naming both and linking the other (an inline style: the policy allows
# those, and this one needs no stylesheet of its own).
_NAV_STYLE = "padding:6px 16px;font:14px sans-serif;background:#f4f4f4;border-bottom:1px solid #ddd"
_NAV_LINKS = (
    ("/docs", "Reference (Redoc)"),
    ("/docs/swagger", "Try a request (Swagger UI)"),
    ("/openapi.json", "openapi.json"),
)


def _nav(here: str) -> str:
    items = (
        f"<b>{label}</b>" if path == here else f'<a href="{path}">{label}</a>' for path, label in _NAV_LINKS
    )
    return f'<nav id="docs-nav" style="{_NAV_STYLE}">{" &middot; ".join(items)}</nav>'


def _page(title: str, head: str, body: str) -> bytes:
    return (
        "<!DOCTYPE html><html><head>"
        f'<meta charset="utf-8"/><meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<title>{title}</title>{head}</head><body style="margin:0">{body}</body></html>'
    ).encode()


class OfflineSwagger(SwaggerRenderPlugin):
    """Swagger UI from the package's copy, started by a static script."""

    def __init__(self) -> None:
        super().__init__(path="/swagger")

    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        base = f"{STATIC_PATH}/swagger-ui"
        return _page(
            f"{openapi_schema['info']['title']} - Swagger UI",
            f'<link rel="stylesheet" href="{base}/swagger-ui.css">',
            f'{_nav("/docs/swagger")}<div id="swagger-ui"></div><script src="{base}/swagger-ui-bundle.js"></script>'
            f'<script src="{base}/init.js"></script>',
        )


class OfflineRedoc(RedocRenderPlugin):
    """Redoc from the package's copy, started by a static script; at /docs and /docs/redoc."""

    def __init__(self) -> None:
        super().__init__(path=["/", "/redoc"], google_fonts=False)

    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        base = f"{STATIC_PATH}/redoc"
        return _page(
            openapi_schema["info"]["title"],
            "",
            f'{_nav("/docs")}<div id="redoc-container"></div><script src="{base}/redoc.standalone.js"></script>'
            f'<script src="{base}/init.js"></script>',
        )


def secured(handlers: list[Any]) -> list[Any]:
    """`handlers`, each the guard guards (not `PUBLIC`) declaring `BEARER` in the document."""
    for handler in handlers:
        if not (handler.opt or {}).get("public"):
            handler.security = [{BEARER: []}]
    return handlers


def render_plugins() -> list[OpenAPIRenderPlugin]:
    return [OfflineRedoc(), OfflineSwagger(), JsonRenderPlugin(), YamlRenderPlugin()]


@dataclass
class RuntimeInfo(Info):
    """`info` with the implementation's name and version under `x-vllm-srun`."""

    runtime: dict[str, str] | None = field(default=None, metadata={"alias": RUNTIME_FIELD})


@dataclass
class RuntimeOpenAPIConfig(OpenAPIConfig):
    """Litestar's config, whose document's `info` also names the implementation."""

    runtime: dict[str, str] = field(default_factory=dict)

    def to_openapi_schema(self) -> OpenAPI:
        schema = super().to_openapi_schema()
        given = {f.name: getattr(schema.info, f.name) for f in fields(schema.info)}
        schema.info = RuntimeInfo(**given, runtime=self.runtime)
        return schema


def openapi_config(name: str, version: str, *, api_version: str, tags: dict[str, str]) -> OpenAPIConfig:
    """The app's OpenAPI config: the document (titled and versioned as the router's contract,
    `name` and `version` in its description and `x-vllm-srun`, `tags` its operations' groups in
    order, each name with its description, `BEARER` its security scheme) and the pages above
    under /docs, public, every response there with the content-security policy."""
    static = create_static_files_router(path="/static", directories=[VENDORED_DIR], include_in_schema=False)
    router = Router(
        path="/docs",
        route_handlers=[static],
        include_in_schema=False,
        opt=PUBLIC,  # a browser sends no key: the pages and what they load answer without one
        response_headers=[ResponseHeader(name="Content-Security-Policy", value=CSP)],
    )
    return RuntimeOpenAPIConfig(
        title=ROUTER_TITLE,
        version=api_version,
        description=(
            f"{name} {version}, a model runtime for the vLLM Semantic Router: its contract "
            f"{api_version}, and the routes this runtime adds to it."
        ),
        runtime={"name": name, "version": version, "api_version": api_version},
        tags=[Tag(name=tag, description=description) for tag, description in tags.items()],
        components=Components(
            security_schemes={
                BEARER: SecurityScheme(
                    type="http",
                    scheme="bearer",
                    description=(
                        "One of the server's API keys (--api-key, --api-key-file). A server "
                        "started without keys takes requests without one."
                    ),
                )
            }
        ),
        render_plugins=render_plugins(),
        openapi_router=router,
    )


def operation_ids(by_path: dict[str, str]) -> OperationIDCreator:
    """The `operation_id` of a controller mounted at several paths: each path's own, from
    `by_path` (the operationId the published document has always given that path)."""

    def creator(handler: Any, method: Any, components: list[Any]) -> str:
        path = "/" + "/".join(c if isinstance(c, str) else f"{{{c.name}}}" for c in components)
        return by_path[path]

    return creator
