"""The app's resources: settings, models, the queue client, bulk jobs, admission counts.

`Runtime.start` creates them in the app's lifespan; `close` releases them in its `finally`,
each step bounded so a stop fits a supervisor's grace period. In the embedded default the
process also runs a device worker; as a replica (`--redis URL`) it loads no engine.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from vllm_srun.app.loading import ServedModel, Serving, bounded
from vllm_srun.app.settings import ServerSettings
from vllm_srun.app.streams import StreamSlots
from vllm_srun.app.tenants import Callers
from vllm_srun.errors import InvalidRequest, ModelNotFound, NotReady
from vllm_srun.plugins.base import LoadedModel
from vllm_srun.plugins.discovery import Plugins, load_plugins
from vllm_srun.plugins.stats import StatLoggerBase, Stats
from vllm_srun.queue.client import QueueClient
from vllm_srun.queue.jobs import BulkStore
from vllm_srun.queue.redis import UNKNOWN_POLICY, EvictionPolicy, blocking_pool, eviction_policy


@dataclass
class Runtime:
    """The app's resources: the queue client, bulk jobs, admission counts and `serving`."""

    settings: ServerSettings
    plugins: Plugins
    stats: Stats
    queue: QueueClient
    serving: Serving
    # Items and tokens this replica has in the queue, per deployment (the admission bound).
    queued: dict[str, tuple[int, int]] = field(default_factory=dict)
    # Surface requests this replica is serving now (bounded by max_concurrent_requests).
    in_flight: int = 0
    # The main Redis's maxmemory-policy as read at start (/health reports an evicting one).
    redis_policy: EvictionPolicy = field(default_factory=lambda: EvictionPolicy(UNKNOWN_POLICY))
    bulk: BulkStore = field(init=False)
    # Who each API key is (app/tenants.py); empty when the server takes no key.
    callers: Callers = field(init=False)
    # Event streams open now, overall and per caller (app/streams.py).
    streams: StreamSlots = field(init=False)
    # Where requests too large for the event loop are tokenized and planned (serving.py).
    planner: ThreadPoolExecutor = field(init=False)

    def __post_init__(self) -> None:
        self.planner = ThreadPoolExecutor(self.settings.plan_threads, thread_name_prefix="plan")
        settings = self.settings
        self.callers = Callers(
            [*settings.api_keys, *([settings.api_key] if settings.api_key else [])],
            shared_cache=settings.shared_cache,
        )
        self.streams = StreamSlots(settings.max_event_streams, settings.max_event_streams_per_caller)
        self.bulk = BulkStore(
            self.queue.redis,
            ttl_s=settings.job_ttl_s,
            chunk_size=settings.bulk_chunk_size,
            quotas=settings.bulk_quotas,
            # Streams read on a pool of their own: they cannot take the request path's.
            streams=blocking_pool(settings.redis_url, settings.event_stream_connections),
            event_batch_bytes=settings.event_batch_bytes,
        )

    @property
    def models(self) -> dict[str, ServedModel]:
        return self.serving.models

    @classmethod
    async def start(cls, settings: ServerSettings) -> Runtime:
        plugins = load_plugins()
        stats = Stats(sinks(plugins))
        serving = Serving.prepare(
            plugins, settings, with_device=settings.embedded and not settings.device_process
        )
        queue = QueueClient(
            settings.redis_url,
            result_ttl_s=settings.cache_ttl_s,
            local_cache_bytes=settings.local_cache_mb << 20,
            cache_url=settings.cache_redis_url,
        )
        runtime = cls(settings=settings, plugins=plugins, stats=stats, queue=queue, serving=serving)
        await queue.start()
        runtime.redis_policy = await eviction_policy(queue.redis)
        await serving.start(stats)
        return runtime

    def stopping(self, grace_s: float) -> None:
        """The server stops taking connections and gives open requests `grace_s` to finish.

        Event streams end now (a client resumes from its Last-Event-ID on another replica);
        requests still waiting for a result `REFUSE_BEFORE_S` before the grace ends are answered
        503, so that none is cut off without a response when the server cancels what is left.
        """
        self.bulk.end_streams()
        asyncio.get_running_loop().call_later(
            max(0.0, grace_s - REFUSE_BEFORE_S), self.queue.refuse, "the server is stopping"
        )

    async def close(self) -> None:
        # Within the grace period left after uvicorn's own (cli.lifecycle.GRACEFUL_STOP_S).
        await bounded("serving", self.serving.close(), 2.5)
        await bounded("queue client", self.queue.close(), 1.0)
        await bounded("event streams' Redis", self.bulk.close(), 1.0)
        self.planner.shutdown(wait=False, cancel_futures=True)

    def model_for(self, name: str | None) -> tuple[ServedModel, LoadedModel]:
        """The model a request names (the only model when it names none), if it is ready."""
        if name is None:
            if len(self.models) != 1:
                raise InvalidRequest(
                    f"model: required when several models are served ({', '.join(self.models)})"
                )
            served = next(iter(self.models.values()))
        else:
            served = self.named(name)
        if served.state != "ready" or served.model is None:
            detail = f": {served.reason}" if served.reason else ""
            raise NotReady(f"model {served.name!r} is {served.state}{detail}")
        return served, served.model

    def named(self, name: str) -> ServedModel:
        """The model whose id or alias is `name`, in whatever state; ModelNotFound otherwise."""
        found = self.serving.find(name)
        if found is None:
            raise ModelNotFound(f"model {_shown(name)!r} is not served here (served: {self.served_names()})")
        return found

    def served_names(self) -> str:
        """Every model's id, with its aliases in parentheses: what a 404 lists."""
        return ", ".join(
            name + (f" (aliases: {', '.join(m.aliases)})" if m.aliases else "")
            for name, m in self.models.items()
        )


def _shown(name: str) -> str:
    """A client's model name as an error quotes it: cut short, since it is the client's text."""
    return name if len(name) <= 100 else name[:100] + "…"


# How long before a stop's grace period ends the requests still waiting are answered 503.
REFUSE_BEFORE_S = 1.0


def sinks(plugins: Plugins) -> list[StatLoggerBase]:
    return [entry.plugin for _, entry in sorted(plugins.of("stat_loggers").items())]
