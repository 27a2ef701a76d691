"""The built-in metrics sink: Prometheus text exposition on `/metrics`.

Each instance keeps its own registry, so several runtimes in one process never collide.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from vllm_srun.plugins.stats import StatLoggerBase

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class PrometheusStatLogger(StatLoggerBase):
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "vllm_srun_requests",
            "Requests by model, surface and status",
            ["model", "surface", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "vllm_srun_request_latency_seconds",
            "Request latency",
            ["model", "surface"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "vllm_srun_batch_size", "Rows per forward", ["model"], buckets=_BATCH_BUCKETS, registry=r
        )
        self.batch_tokens = Counter(
            "vllm_srun_batch_tokens", "Tokens run through forwards", ["model"], registry=r
        )
        self.forward_seconds = Histogram(
            "vllm_srun_forward_seconds", "Forward duration", ["model"], buckets=_LATENCY_BUCKETS, registry=r
        )
        self.queue_seconds = Histogram(
            "vllm_srun_queue_seconds",
            "Time items waited before their forward",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge("vllm_srun_queue_depth", "Jobs waiting in the queue", ["model"], registry=r)
        self.cache_hits = Counter(
            "vllm_srun_cache_hits", "Items answered from the result cache", ["model"], registry=r
        )
        self.cache_misses = Counter("vllm_srun_cache_misses", "Items sent to a worker", ["model"], registry=r)

    def record_request(self, *, model: str, surface: str, status: int, latency_s: float) -> None:
        self.requests.labels(model, surface, str(status)).inc()
        self.latency.labels(model, surface).observe(latency_s)

    def record_cache(self, *, model: str, hits: int, misses: int) -> None:
        self.cache_hits.labels(model).inc(hits)
        self.cache_misses.labels(model).inc(misses)

    def record_batch(self, *, model: str, size: int, tokens: int, forward_s: float, queue_s: float) -> None:
        self.batch_size.labels(model).observe(size)
        self.batch_tokens.labels(model).inc(tokens)
        self.forward_seconds.labels(model).observe(forward_s)
        self.queue_seconds.labels(model).observe(queue_s)

    def record_queue_depth(self, *, model: str, depth: int) -> None:
        self.queue_depth.labels(model).set(depth)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
