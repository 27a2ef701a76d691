"""A surface request as work items, and each item's cache key.

`plan` is how the app and bulk chunks both ask a model for a request's items; `assign_keys`
gives each item its cache key (`keys.cache_key`) as the items enter the result gateway.
`plan_with_keys` does both at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from vllm_srun.errors import InvalidRequest, rust_panic
from vllm_srun.plugins.base import LoadedModel, Plan, WorkItem
from vllm_srun.plugins.bodies import Overflow
from vllm_srun.queue.keys import cache_key


@dataclass(frozen=True)
class KeyIdentity:
    """What an item's cache key holds besides the item: the model's digest, its numerics and
    the caller's cache salt (`keys.cache_salt`; "" where callers share a cache)."""

    model_sha256: str
    numerics: str
    salt: str = ""


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


def plan(
    model: LoadedModel, surface: str, request: Any, *, default_overflow: Overflow | None = "reject"
) -> Plan:
    """The model's plan for `request` (its items without cache keys). A tokenizer's Rust panic
    on this input is this request's InvalidRequest.

    `default_overflow` is the policy for a request that names none: "reject" (per-item errors:
    bulk jobs), "truncate" (`serve --auto-truncate`), or None to let the model choose where it
    says it does (interactive requests; see `with_overflow`)."""
    request = with_overflow(model, surface, request, default_overflow)
    try:
        return model.plan_surface(surface, request)
    except BaseException as exc:
        if not rust_panic(exc):
            raise
        raise InvalidRequest(f"input: the model's tokenizer failed on it ({exc})") from None


def assign_keys(items: Sequence[WorkItem], identity: KeyIdentity) -> None:
    """Set each item's `cache_key` from `identity` and the item's own options and token ids."""
    for item in items:
        item.cache_key = cache_key(
            model_sha256=identity.model_sha256,
            numerics=identity.numerics,
            key_extra=item.key_extra,
            token_ids=item.token_ids,
            type_ids=item.type_ids,
            salt=identity.salt,
        )


def plan_with_keys(
    model: LoadedModel,
    surface: str,
    request: Any,
    *,
    default_overflow: Overflow | None = "reject",
    cache_salt: str = "",
) -> Plan:
    """`plan`, each item then with the cache key the gateway would give it."""
    planned = plan(model, surface, request, default_overflow=default_overflow)
    assign_keys(planned.items, KeyIdentity(model.info.model_sha256, model.info.numerics, cache_salt))
    return planned
