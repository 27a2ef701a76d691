"""GET /health (200 only when every model can be answered) and GET /health/live, in the
upstream contract's `Health` and `Liveness` shapes (2.3.0).

A model's `status` is upstream's: `loading`, `warming`, `ready`, `failed`, or `degraded` for a
model that is loaded but cannot be answered now (a replica's model no worker serves, Redis out
of reach), with the `reason`. Our own finer states stay under `states` (`no_worker`,
`redis_unavailable`), and the failures' reasons under `reasons`. Where API keys are configured,
a request without a valid key gets the status alone (models, reasons and names left empty).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import msgspec
from litestar import Response, get
from litestar.datastructures import State
from litestar.openapi import ResponseSpec

from vllm_srun import defaults
from vllm_srun.app.runtime import Runtime
from vllm_srun.app.tenants import CALLER
from vllm_srun.errors import SrunError

Status = Literal["starting", "loading", "warming", "ready", "degraded", "failed"]

# Our states that upstream's enum names differently, and why a model in one is degraded.
_DEGRADED = {
    "no_worker": "no device worker serves this model",
    "redis_unavailable": "Redis is unavailable",
}
# The order a process comes up in: while models are still coming up, the earliest one's phase.
_PHASES: tuple[Status, ...] = ("starting", "loading", "warming")
_STATUS: dict[str, Status] = {
    "loading": "loading",
    "warming": "warming",
    "ready": "ready",
    "failed": "failed",
}


class ModelHealth(msgspec.Struct, omit_defaults=True):
    """One model's readiness."""

    status: Status
    reason: str | None = None


class Health(msgspec.Struct, omit_defaults=True):
    """Readiness of the process and its models. `reason` (why it is not ready) and `model`
    (the one model a single-model process serves) are always present, null when there is
    none: the router's dashboard probe reads both. `states`, `reasons` and `redis` are ours:
    each model's own state, the reasons of those that failed, and an evicting main Redis."""

    api_version: str
    status: Status
    models: dict[str, ModelHealth]
    # No default, so omit_defaults never leaves them out.
    reason: str | None
    model: str | None
    states: dict[str, str] = msgspec.field(default_factory=dict)
    reasons: dict[str, str] = msgspec.field(default_factory=dict)
    redis: dict[str, Any] | None = None


class Liveness(msgspec.Struct):
    api_version: str
    status: Literal["alive"]


@dataclass(frozen=True)
class ModelState:
    """A model's state as we name it (`state`) and as upstream does (`status`, `reason`)."""

    state: str
    status: Status
    reason: str | None


async def model_states(runtime: Runtime) -> dict[str, ModelState]:
    """Each model's state; a replica's model is ready only while a worker serves it."""
    states: dict[str, ModelState] = {}
    # A link known to be down is reported at once, with why (not after a Redis timeout).
    link_down = runtime.queue.link_down
    for name, served in runtime.models.items():
        state = served.state
        why = None
        if state == "ready" and link_down is not None:
            state, why = "redis_unavailable", link_down
        elif state == "ready" and (not runtime.settings.embedded or runtime.settings.device_process):
            try:
                if await runtime.queue.workers.live(name) == 0:
                    state = "no_worker"
            except SrunError as exc:
                state, why = "redis_unavailable", str(exc)
        status: Status
        reason: str | None
        if state in _DEGRADED:
            status, reason = "degraded", _DEGRADED[state] + (f": {why}" if why else "")
        else:
            status, reason = _STATUS.get(state, "starting"), served.reason
        states[name] = ModelState(state, status, reason)
    return states


def overall(states: dict[str, ModelState]) -> tuple[Status, str | None]:
    """The process's status: ready when every model is; failed when every one failed;
    degraded when some failed or cannot be answered; else the earliest phase still running.
    The reason names each model that is not ready."""
    statuses = [s.status for s in states.values()]
    reason = "; ".join(f"{name}: {s.reason or s.status}" for name, s in states.items() if s.status != "ready")
    if statuses and all(s == "ready" for s in statuses):
        return "ready", None
    if statuses and all(s == "failed" for s in statuses):
        return "failed", reason
    if any(s in ("failed", "degraded") for s in statuses):
        return "degraded", reason
    return next((phase for phase in _PHASES if phase in statuses), "starting"), reason or None


@get(
    "/health",
    summary="Readiness: 200 only when every model is ready",
    opt={"public": True},
    responses={503: ResponseSpec(Health, description="Not ready: the same body", generate_examples=False)},
)
async def health(state: State) -> Response[Health]:
    runtime: Runtime = state.runtime
    states = await model_states(runtime)
    status, reason = overall(states)
    code = 200 if status == "ready" else 503
    if runtime.callers and CALLER.get() is None:
        # Keys are configured and none was given: the status alone, no model names or reasons
        # (a broken package's reason names its absolute path).
        return Response(
            Health(api_version=defaults.API_VERSION, status=status, models={}, reason=None, model=None),
            status_code=code,
        )
    body = Health(
        api_version=defaults.API_VERSION,
        status=status,
        reason=reason,
        model=next(iter(states)) if len(states) == 1 else None,
        models={name: ModelHealth(s.status, s.reason) for name, s in states.items()},
        states={name: s.state for name, s in states.items()},
        reasons={name: s.reason for name, s in runtime.models.items() if s.reason},
        # Ready still with an evicting Redis: the server answers, but may lose queued work.
        redis=runtime.redis_policy.describe() if runtime.redis_policy.evicting else None,
    )
    return Response(body, status_code=code)


@get("/health/live", summary="Liveness: the process answers", opt={"public": True})
async def live() -> Liveness:
    return Liveness(api_version=defaults.API_VERSION, status="alive")
