"""The app's route table: each surface's routes, its own first (`surfaces`), then the peers'
adapters onto it (`vllm_srun.app.peers`), and the routes that reach no one surface. The app
mounts them from here, labels each request on a surface route with its surface's name, and
groups every route in the OpenAPI reference under one tag (`TAGS`, `tagged`).
"""

from __future__ import annotations

from litestar.handlers import HTTPRouteHandler

from vllm_srun.app.peers import cohere, infinity, openai
from vllm_srun.app.peers.tei import embed as tei_embed
from vllm_srun.app.peers.tei import info as tei_info
from vllm_srun.app.peers.tei import predict as tei_predict
from vllm_srun.app.peers.tei import rerank as tei_rerank
from vllm_srun.app.peers.tei import root as tei_root
from vllm_srun.app.peers.vllm import classify as vllm_classify
from vllm_srun.app.peers.vllm import embeddings as vllm_embeddings
from vllm_srun.app.peers.vllm import models as vllm_models
from vllm_srun.app.peers.vllm import rerank as vllm_rerank
from vllm_srun.app.peers.vllm import score as vllm_score
from vllm_srun.app.routes import bundle, surfaces

# Every route that reaches a surface, by surface; a handler mounted at several paths counts
# each of them (in sorted order).
SURFACE_ROUTES: dict[str, tuple[HTTPRouteHandler, ...]] = {
    "classify": (surfaces.classify, tei_predict.predict, vllm_classify.classify, infinity.infinity_classify),
    "embeddings": (
        surfaces.embeddings,
        tei_embed.embed,
        tei_embed.embed_sparse,
        tei_embed.embed_all,
        tei_embed.similarity,
        openai.embeddings,
        infinity.infinity_embeddings,
        vllm_embeddings.embeddings,
        vllm_embeddings.embeddings_v1,
        vllm_classify.pooling,
        cohere.cohere_embed_v1,
        cohere.cohere_embed_v2,
    ),
    "rerank": (
        surfaces.rerank,
        tei_rerank.rerank,
        cohere.cohere_rerank,
        vllm_rerank.rerank,
        vllm_rerank.rerank_v1,
        infinity.infinity_rerank,
        vllm_score.score,
    ),
    "decisions": (surfaces.decisions, surfaces.systemone),
}

# A bundle counts as `bundle`, under no one model (its tasks may name several).
BUNDLE_ROUTES = {"bundle": (bundle.bundle,)}

# text-embeddings-inference's routes that reach no one surface: its model's facts and
# tokenizer, its model route (by the model's kind) and its health route; Infinity's; vLLM's.
PEER_ROUTES: tuple[HTTPRouteHandler, ...] = (
    tei_info.info,
    tei_info.tokenize,
    tei_info.decode,
    tei_root.root_options,  # first: see its docstring
    tei_root.root,
    tei_root.invocations,
    tei_root.ping,
    infinity.infinity_models,
    infinity.infinity_health,
    vllm_models.list_models,
    vllm_models.retrieve_model,
)

# The OpenAPI reference's groups, in its order: this runtime's own routes by what they serve,
# then each peer's adapters under the peer's name, so that a compatibility route is listed once,
# beside its peer's others.
TAGS: dict[str, str] = {
    "Surfaces": "This runtime's own routes onto its surfaces (classify, embeddings, rerank, decisions), "
    "and a bundle of surface requests in one call.",
    "Models": "The served models: ids, aliases, surfaces, numerics and limits.",
    "Bulk jobs": "Many requests as one job: create it, follow its progress, read its results in input order.",
    "Service": "Where this server's docs are, its health and its metrics.",
    "OpenAI": "OpenAI's embeddings route at the root, as TEI and Infinity serve it, and its Batch API "
    "(/v1/files, /v1/batches) onto bulk jobs.",
    "TEI": "text-embeddings-inference's routes, its SageMaker and Inference API routes among them.",
    "vLLM": "vLLM's pooling server's routes, at the root and under /vllm (and /vllm/v1), its base URLs here.",
    "Infinity": "Infinity's routes, under /infinity.",
    "Cohere": "Cohere's embed (v1, v2) and rerank (v2) routes.",
}
# A handler's tag, by the package or module it is declared in (the longest that names it).
_TAG_OF_MODULE = {
    "vllm_srun.app.routes": "Surfaces",
    "vllm_srun.app.service": "Service",
    "vllm_srun.app.service.model_cards": "Models",
    "vllm_srun.app.service.jobs": "Bulk jobs",
    "vllm_srun.app.peers.openai": "OpenAI",
    "vllm_srun.app.peers.openai_batch": "OpenAI",
    "vllm_srun.app.peers.tei": "TEI",
    "vllm_srun.app.peers.vllm": "vLLM",
    "vllm_srun.app.peers.infinity": "Infinity",
    "vllm_srun.app.peers.cohere": "Cohere",
}


def surface_paths(routes: dict[str, tuple[HTTPRouteHandler, ...]]) -> dict[str, str]:
    """Each path of `routes` and the name it is listed under, in order; a ValueError for a
    path listed twice (its requests would count under one name only)."""
    out: dict[str, str] = {}
    for name, handlers in routes.items():
        for handler in handlers:
            for path in sorted(handler.paths):
                if path in out:
                    raise ValueError(f"{path} is listed under {out[path]!r} and {name!r}")
                out[path] = name
    return out


def tag_of(handler: HTTPRouteHandler) -> str | None:
    """`handler`'s tag in TAGS, by its module (`_TAG_OF_MODULE`): a ValueError for a module of
    this app none names, so that no route of ours goes untagged; None for a handler from
    elsewhere (a caller's own route table), which keeps the tags it was declared with."""
    module = handler.fn.__module__
    names = [name for name in _TAG_OF_MODULE if module == name or module.startswith(name + ".")]
    if names:
        return _TAG_OF_MODULE[max(names, key=len)]
    if module.startswith("vllm_srun.app."):
        raise ValueError(f"{handler} ({module}) is in no OpenAPI tag: add its module to _TAG_OF_MODULE")
    return None


def tagged(handlers: list[HTTPRouteHandler]) -> list[HTTPRouteHandler]:
    """`handlers`, each of ours tagged with `tag_of` alone."""
    for handler in handlers:
        tag = tag_of(handler)
        if tag is not None:
            handler.tags = [tag]
    return handlers
