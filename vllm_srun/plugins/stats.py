"""Metrics sinks: the `vllm_srun.stat_loggers` entry-point group subclasses `StatLoggerBase`.

The runtime records through one `Stats` fan-out; each installed sink decides what to keep.
Every method has a no-op default so a sink implements only what it cares about.
"""

from __future__ import annotations

from collections.abc import Sequence

from vllm_srun.plugins.base import Plugin


class StatLoggerBase(Plugin):
    """A metrics sink. `render` returns (body, content type) for `/metrics`, or None."""

    def record_request(self, *, model: str, surface: str, status: int, latency_s: float) -> None:
        return None

    def record_cache(self, *, model: str, hits: int, misses: int) -> None:
        return None

    def record_batch(self, *, model: str, size: int, tokens: int, forward_s: float, queue_s: float) -> None:
        return None

    def record_queue_depth(self, *, model: str, depth: int) -> None:
        return None

    def render(self) -> tuple[bytes, str] | None:
        return None


class Stats:
    """Fans each record out to every sink; a failing sink never fails the request."""

    def __init__(self, sinks: Sequence[StatLoggerBase]) -> None:
        self.sinks = list(sinks)

    def record_request(self, *, model: str, surface: str, status: int, latency_s: float) -> None:
        for sink in self.sinks:
            sink.record_request(model=model, surface=surface, status=status, latency_s=latency_s)

    def record_cache(self, *, model: str, hits: int, misses: int) -> None:
        for sink in self.sinks:
            sink.record_cache(model=model, hits=hits, misses=misses)

    def record_batch(self, *, model: str, size: int, tokens: int, forward_s: float, queue_s: float) -> None:
        for sink in self.sinks:
            sink.record_batch(model=model, size=size, tokens=tokens, forward_s=forward_s, queue_s=queue_s)

    def record_queue_depth(self, *, model: str, depth: int) -> None:
        for sink in self.sinks:
            sink.record_queue_depth(model=model, depth=depth)

    def render(self) -> tuple[bytes, str]:
        for sink in self.sinks:
            rendered = sink.render()
            if rendered is not None:
                return rendered
        return b"", "text/plain; version=0.0.4"
