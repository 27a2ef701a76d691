"""Planning a surface request into work items with their cache keys.

The app and bulk chunks plan the same way, through `plan_with_keys`; the cache key itself is
built by `keys.cache_key`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from vllm_srun.errors import InvalidRequest, rust_panic
from vllm_srun.plugins.base import LoadedModel, Plan
from vllm_srun.plugins.bodies import Overflow
from vllm_srun.queue.keys import cache_key


def with_overflow(model: LoadedModel, surface: str, request: Any, default: Overflow | None) -> Any:
    """`request` with its unset `options.overflow` replaced by `default`. With no default, a
    model that reads an unset overflow itself on `surface` gets None (task_heads answers an
    over-long embeddings input with a 400); every other model gets "reject", so a family never
    has to know that the field may be unset."""
    options = getattr(request, "options", None)
    if options is None or options.overflow is not None:
        return request
    if default is None and surface in model.unset_overflow_surfaces:
        return request
    resolved = msgspec.structs.replace(options, overflow=default or "reject")
    return msgspec.structs.replace(request, options=resolved)


def plan_with_keys(
    model: LoadedModel,
    surface: str,
    request: Any,
    *,
    default_overflow: Overflow | None = "reject",
    cache_salt: str = "",
) -> Plan:
    """The model's plan for `request`, each item with its cache key: the app and bulk chunks plan
    the same way. A tokenizer's Rust panic on this input is this request's InvalidRequest.

    `default_overflow` is the policy for a request that names none: "reject" (per-item errors:
    bulk jobs), "truncate" (`serve --auto-truncate`), or None to let the model choose where it
    says it does (interactive requests; see `with_overflow`). `cache_salt` is the caller's
    (`keys.cache_salt`) where callers' caches are apart, else ""."""
    request = with_overflow(model, surface, request, default_overflow)
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
            salt=cache_salt,
        )
    return plan
