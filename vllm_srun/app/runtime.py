"""The app's resources: settings, loaded models, the queue client and (embedded) the worker.

Created in the app's lifespan and released in its `finally`. In the embedded default the
same process also runs a device worker; as a replica (`--redis URL`) it loads no engine.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import structlog

from vllm_srun.errors import ConfigError, InvalidRequest, ModelNotFound, NotReady
from vllm_srun.plugins.base import LoadedModel
from vllm_srun.plugins.registry import Plugins, load_plugins
from vllm_srun.plugins.stats import StatLoggerBase, Stats
from vllm_srun.queue.bulk import BulkStore
from vllm_srun.queue.client import QueueClient
from vllm_srun.queue.coalescer import BatchLimits
from vllm_srun.queue.worker import Deployment, DeviceWorker
from vllm_srun.registry.loader import ModelOptions, Placement, load_model

log = structlog.get_logger("vllm_srun.app")


@dataclass(frozen=True, kw_only=True)
class ServerSettings:
    """Everything `serve` was told. Unknown keys are impossible: this is a typed record."""

    models: tuple[ModelOptions, ...]
    redis_url: str
    embedded: bool
    limits: BatchLimits = field(default_factory=BatchLimits)
    max_request_bytes: int = 4 * 1024 * 1024
    max_inputs: int = 2048
    max_queued_items: int = 100_000
    max_queued_tokens: int = 10_000_000
    request_timeout_s: float = 60.0
    cache_ttl_s: int = 3600
    api_key: str | None = None
    job_timeout_s: float = 300.0
    job_ttl_s: int = 86400
    max_job_requests: int = 1_000_000
    max_job_bytes: int = 512 * 1024 * 1024
    bulk_chunk_size: int = 256


@dataclass
class ServedModel:
    model: LoadedModel
    placement: Placement
    state: str = "ready"


@dataclass
class Runtime:
    settings: ServerSettings
    plugins: Plugins
    stats: Stats
    queue: QueueClient
    models: dict[str, ServedModel] = field(default_factory=dict)
    worker: DeviceWorker | None = None
    started_s: float = field(default_factory=time.time)
    # Items and tokens this replica has in the queue, per deployment (the admission bound).
    queued: dict[str, tuple[int, int]] = field(default_factory=dict)
    bulk: BulkStore = field(init=False)

    def __post_init__(self) -> None:
        self.bulk = BulkStore(
            self.queue.redis, ttl_s=self.settings.job_ttl_s, chunk_size=self.settings.bulk_chunk_size
        )

    @classmethod
    async def start(cls, settings: ServerSettings) -> Runtime:
        plugins = load_plugins()
        stats = Stats(_sinks(plugins))
        queue = QueueClient(settings.redis_url, result_ttl_s=settings.cache_ttl_s)
        runtime = cls(settings=settings, plugins=plugins, stats=stats, queue=queue)
        await queue.start()
        try:
            for options in settings.models:
                model, placement = await asyncio.to_thread(
                    load_model, plugins, options, with_engine=settings.embedded
                )
                if model.info.name in runtime.models:
                    raise ConfigError(f"two models are named {model.info.name!r}: give --served-model-name")
                runtime.models[model.info.name] = ServedModel(model, placement)
            if settings.embedded:
                runtime.worker = start_worker(settings, runtime.models, stats)
                await runtime.worker.start()
        except BaseException:
            await runtime.close()
            raise
        return runtime

    async def close(self) -> None:
        if self.worker is not None:
            await self.worker.close()
        await self.queue.close()

    def model_for(self, name: str | None) -> ServedModel:
        """The model a request names; the only model when it names none."""
        if name is None:
            if len(self.models) == 1:
                return next(iter(self.models.values()))
            raise InvalidRequest(f"model: required when several models are served ({', '.join(self.models)})")
        served = self.models.get(name)
        if served is None:
            raise ModelNotFound(f"model {name!r} is not served here (served: {', '.join(self.models)})")
        if served.state != "ready":
            raise NotReady(f"model {name!r} is {served.state}")
        return served


def _sinks(plugins: Plugins) -> list[StatLoggerBase]:
    return [entry.plugin for _, entry in sorted(plugins.of("stat_loggers").items())]


def start_worker(settings: ServerSettings, models: dict[str, ServedModel], stats: Stats) -> DeviceWorker:
    """A device worker for `models`, one single-thread executor per device."""
    executors: dict[str, ThreadPoolExecutor] = {}
    deployments = []
    for name, served in models.items():
        device = served.placement.device
        if device not in executors:
            executors[device] = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"forward-{device}")
        deployments.append(Deployment(model=served.model, limits=settings.limits, executor=executors[device]))
        log.info("deployment", model=name, device=device, engine=served.placement.engine)
    return DeviceWorker(
        redis_url=settings.redis_url,
        deployments=deployments,
        stats=stats,
        job_timeout_s=settings.job_timeout_s,
    )


def describe_settings(settings: ServerSettings) -> dict[str, Any]:
    return {
        "embedded": settings.embedded,
        "max_num_seqs": settings.limits.max_num_seqs,
        "max_num_batched_tokens": settings.limits.max_num_batched_tokens,
        "batch_wait_ms": settings.limits.batch_wait_ms,
    }
