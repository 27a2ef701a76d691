"""Metrics sinks: the `vllm_srun.stat_loggers` entry-point group subclasses `StatLoggerBase`.

The runtime records through one `Stats` fan-out; each installed sink decides what to keep.
Every method has a no-op default so a sink implements only what it cares about.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import structlog

from vllm_srun.plugins.base import Plugin

log = structlog.get_logger("vllm_srun.stats")

_T = TypeVar("_T")


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
    """Fans each record out to every sink; a failing sink never fails the request.

    A sink that raises is skipped for that record and logged with the reason, once per sink
    and method, so a broken metrics backend neither ends the coalescer nor floods the log.
    """

    def __init__(self, sinks: Sequence[StatLoggerBase]) -> None:
        self.sinks = list(sinks)
        self._failed: set[tuple[int, str]] = set()

    def _each(self, method: str, call: Callable[[StatLoggerBase], object]) -> None:
        for sink in self.sinks:
            self._guarded(sink, method, call)

    def _guarded(self, sink: StatLoggerBase, method: str, call: Callable[[StatLoggerBase], _T]) -> _T | None:
        try:
            return call(sink)
        except Exception as exc:  # any sink's bug is its own: serving goes on
            if (id(sink), method) not in self._failed:
                self._failed.add((id(sink), method))
                log.error(
                    "stat_logger_failed",
                    sink=sink.name or type(sink).__name__,
                    method=method,
                    reason=f"{type(exc).__name__}: {exc}",
                )
            return None

    def record_request(self, *, model: str, surface: str, status: int, latency_s: float) -> None:
        self._each(
            "record_request",
            lambda s: s.record_request(model=model, surface=surface, status=status, latency_s=latency_s),
        )

    def record_cache(self, *, model: str, hits: int, misses: int) -> None:
        self._each("record_cache", lambda s: s.record_cache(model=model, hits=hits, misses=misses))

    def record_batch(self, *, model: str, size: int, tokens: int, forward_s: float, queue_s: float) -> None:
        self._each(
            "record_batch",
            lambda s: s.record_batch(
                model=model, size=size, tokens=tokens, forward_s=forward_s, queue_s=queue_s
            ),
        )

    def record_queue_depth(self, *, model: str, depth: int) -> None:
        self._each("record_queue_depth", lambda s: s.record_queue_depth(model=model, depth=depth))

    def render(self) -> tuple[bytes, str]:
        """The first sink's page that renders; an empty page when none does."""
        for sink in self.sinks:
            rendered = self._guarded(sink, "render", lambda s: s.render())
            if rendered is not None:
                return rendered
        return b"", "text/plain; version=0.0.4"
