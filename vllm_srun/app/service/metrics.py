"""GET /metrics: what the installed stat loggers render (Prometheus by default)."""

from __future__ import annotations

from litestar import MediaType, Response, get
from litestar.datastructures import State

from vllm_srun.app.runtime import Runtime
from vllm_srun.queue import keys
from vllm_srun.queue.redis import REDIS_ERRORS


@get("/metrics", summary="Prometheus metrics", media_type=MediaType.TEXT, include_in_schema=True)
async def metrics(state: State) -> Response[bytes]:
    runtime: Runtime = state.runtime
    for name in runtime.models:
        try:
            depth = await runtime.queue.redis.zcard(keys.queue_name(name))
        except REDIS_ERRORS:
            continue
        runtime.stats.record_queue_depth(model=name, depth=int(depth))
    body, content_type = runtime.stats.render()
    # Litestar appends `charset=utf-8` to every text/* type; one the renderer names too repeats it.
    params = [p for p in content_type.split(";") if not p.strip().lower().startswith("charset=")]
    return Response(body, media_type=";".join(params))
