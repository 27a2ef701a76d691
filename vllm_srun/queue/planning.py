"""Planning a surface request into work items with their cache keys.

The app and bulk chunks plan the same way, through `plan_with_keys`; the cache key itself is
built by `keys.cache_key`.
"""

from __future__ import annotations

from typing import Any

from vllm_srun.errors import InvalidRequest, rust_panic
from vllm_srun.plugins.base import LoadedModel, Plan
from vllm_srun.queue.keys import cache_key


def plan_with_keys(model: LoadedModel, surface: str, request: Any) -> Plan:
    """The model's plan for `request`, each item with its cache key: the app and bulk chunks plan
    the same way. A tokenizer's Rust panic on this input is this request's InvalidRequest."""
    try:
        plan = model.plan_surface(surface, request)
    except BaseException as exc:
        if not rust_panic(exc):
            raise
        raise InvalidRequest(f"input: the model's tokenizer failed on it ({exc})") from None
    for item in plan.items:
        item.cache_key = cache_key(
            model_sha256=model.info.model_sha256,
            numerics=model.info.numerics,
            key_extra=item.key_extra,
            token_ids=item.token_ids,
            type_ids=item.type_ids,
        )
    return plan
