"""The app's route table: each surface's routes, its own first (`surfaces`), then the peers'
adapters onto it (`vllm_srun.app.peers`), and the routes that reach no one surface. The app
mounts them from here and labels each request on a surface route with its surface's name.
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
# tokenizer, its model route (by the model's kind) and its health routes; and Infinity's.
PEER_ROUTES: tuple[HTTPRouteHandler, ...] = (
    tei_info.info,
    tei_info.tokenize,
    tei_info.decode,
    tei_root.root_options,  # first: see its docstring
    tei_root.root,
    tei_root.invocations,
    tei_root.root_health,
    tei_root.ping,
    infinity.infinity_models,
    infinity.infinity_health,
)


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
