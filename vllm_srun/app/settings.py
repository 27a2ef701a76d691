"""What `serve` or `worker` was told: the server's settings and each model's.

Typed, keyword-only records; what they leave out is `vllm_srun.defaults`'.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from vllm_srun import defaults
from vllm_srun.plugins.base import LoadedModel
from vllm_srun.queue.jobs import BulkQuotas
from vllm_srun.queue.worker.coalescer import BatchLimits
from vllm_srun.registry.loader import ModelOptions


@dataclass(frozen=True, kw_only=True)
class ModelSettings:
    """One model to serve and its batching limits."""

    options: ModelOptions
    limits: BatchLimits = field(default_factory=BatchLimits)


@dataclass(frozen=True, kw_only=True)
class ServerSettings:
    """Everything `serve` or `worker` was told. Unknown keys are impossible: this is a typed
    record, and what it leaves out is `vllm_srun.defaults`'."""

    models: tuple[ModelSettings, ...]
    redis_url: str
    embedded: bool
    # Embedded, with its device worker in a child process (serve --device-process): this
    # process loads no engine, as a replica's.
    device_process: bool = False
    max_request_bytes: int = defaults.MAX_REQUEST_BYTES
    max_inputs: int = defaults.MAX_INPUTS
    max_bundle_tasks: int = defaults.MAX_BUNDLE_TASKS
    max_queued_items: int = defaults.MAX_QUEUED_ITEMS
    max_concurrent_requests: int = defaults.MAX_CONCURRENT_REQUESTS
    plan_threads: int = defaults.PLAN_THREADS
    max_queued_tokens: int = defaults.MAX_QUEUED_TOKENS
    request_timeout_s: float = defaults.REQUEST_TIMEOUT_S
    cache_ttl_s: int = defaults.CACHE_TTL_S
    local_cache_mb: int = defaults.LOCAL_CACHE_MB
    api_key: str | None = None
    # More keys (--api-key-file), each its own caller (app/tenants.py), and whether their cached
    # results are shared (--shared-cache) rather than salted apart when there are several.
    api_keys: tuple[str, ...] = ()
    shared_cache: bool = False
    # Job event streams (GET /v1/jobs/{id}/events) open at once, per replica and per caller;
    # the connections of the blocking pool their Redis reads share; bytes of results one read
    # of a stream holds.
    max_event_streams: int = defaults.MAX_EVENT_STREAMS
    max_event_streams_per_caller: int = defaults.MAX_EVENT_STREAMS_PER_CALLER
    event_stream_connections: int = defaults.EVENT_STREAM_CONNECTIONS
    event_batch_bytes: int = defaults.EVENT_BATCH_BYTES
    job_timeout_s: float = defaults.JOB_TIMEOUT_S
    job_ttl_s: int = defaults.JOB_TTL_S
    max_job_requests: int = defaults.MAX_JOB_REQUESTS
    max_job_bytes: int = defaults.MAX_JOB_BYTES
    bulk_chunk_size: int = defaults.BULK_CHUNK_SIZE
    # What bulk jobs may hold in the state Redis, which never evicts.
    bulk_quotas: BulkQuotas = field(default_factory=BulkQuotas)
    # Threads per CPU forward, handed to each forward executor (None: torch's own choice).
    intra_op_threads: int | None = defaults.INTRA_OP_THREADS
    # A request that names no options.overflow has its over-long inputs truncated (TEI's flag).
    auto_truncate: bool = False
    # The result cache's own Redis (--cache-redis); None: the main Redis holds it too.
    cache_redis_url: str | None = None
    # By model name, what a loaded model must pass before it is ready (serve --config: the
    # router's decision signals bound to it). A ConfigError there fails the model and is a
    # start-up error: `on_config_error` hears it (serve stops), and `Serving.config_error` holds it.
    model_checks: Mapping[str, Callable[[LoadedModel], None]] = field(default_factory=dict)
    on_config_error: Callable[[str], None] | None = None
