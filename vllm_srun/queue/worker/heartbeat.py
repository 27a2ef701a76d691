"""A device worker's heartbeat: which workers are live for a deployment, and what their engines run.

`beat` marks a worker live for `HEARTBEAT_TTL_S` in `keys.worker_key` with its engine
description in `keys.engines_key`, and drops the workers whose heartbeats lapsed.
"""

from __future__ import annotations

import json
import time
from typing import Any

from vllm_srun.plugins.base import LoadedModel
from vllm_srun.queue import keys, scripts
from vllm_srun.queue.redis import run_script

HEARTBEAT_S = 2.0
HEARTBEAT_TTL_S = 6.0

# A worker's heartbeat and engine description, dropping the workers that lapsed (lua/worker_beat.lua).
_BEAT = scripts.load("worker_beat")


def engine_description(model: LoadedModel) -> str:
    """What the model's engine model says of itself (`describe()`: the paths it runs, the
    memory they add), as JSON; `{}` for an engine model that says nothing."""
    describe = getattr(model.engine_model, "describe", None)
    return json.dumps(describe() if callable(describe) else {})


async def beat(redis: Any, worker_id: str, models: dict[str, LoadedModel]) -> None:
    """Mark `worker_id` live for each deployment in `models`, for HEARTBEAT_TTL_S, and drop
    the workers whose heartbeats lapsed (they died without withdrawing)."""
    now_ms = int(time.time() * 1000)
    expires_ms = now_ms + int(HEARTBEAT_TTL_S * 1000)
    async with redis.pipeline(transaction=False) as pipe:
        for name, model in models.items():
            args: list[str | int] = [now_ms, expires_ms, worker_id, engine_description(model)]
            await run_script(pipe, _BEAT, [keys.worker_key(name), keys.engines_key(name)], args)
        await pipe.execute()
