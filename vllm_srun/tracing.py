"""OpenTelemetry spans for a request, across the app replica and the worker that ran its job.

On only when `OTEL_EXPORTER_OTLP_ENDPOINT` is set (OTLP/HTTP, the `otel` extra) or
`VLLM_SRUN_TRACE_FILE` names a file (one JSON line per finished span). Otherwise OpenTelemetry
is never imported: `span` hands back a shared do-nothing context manager, `inject` and `current`
answer None. The W3C trace context travels in the queued job (`JobPayload.trace`), so one trace
covers both processes.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import structlog

TRACE_FILE_ENV = "VLLM_SRUN_TRACE_FILE"
OTLP_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"

log = structlog.get_logger("vllm_srun.tracing")

# Read once: whether this process traces at all. The hot path tests only this.
ON = bool(os.environ.get(OTLP_ENV) or os.environ.get(TRACE_FILE_ENV))

_tracer: Any = None
_setup_lock = threading.Lock()


class _NoSpan:
    """What `span` yields when tracing is off: accepts attributes and drops them."""

    __slots__ = ()

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def set(self, **attrs: Any) -> None:
        return None

    def end(self, **attrs: Any) -> None:
        return None


_NO_SPAN = _NoSpan()


class _Span:
    """A started span: `set` adds attributes, `end` ends it once (later calls do nothing)."""

    __slots__ = ("_ended", "_span")

    def __init__(self, span: Any) -> None:
        self._span = span
        self._ended = False

    def set(self, **attrs: Any) -> None:
        self._span.set_attributes(_attributes(attrs))

    def end(self, **attrs: Any) -> None:
        if self._ended:
            return
        self._ended = True
        if attrs:
            self.set(**attrs)
        self._span.end()


def _attributes(attrs: Mapping[str, Any]) -> dict[str, Any]:
    # OpenTelemetry takes str, bool, int, float (or sequences of them); None is left out.
    return {
        f"srun.{key}" if "." not in key else key: value
        if isinstance(value, (str, bool, int, float))
        else str(value)
        for key, value in attrs.items()
        if value is not None
    }


def _json_lines_exporter(path: str) -> Any:
    """An exporter that appends every finished span to `path` as one JSON line: the test hook,
    readable across processes without a collector."""
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    lock = threading.Lock()

    class JsonLinesExporter(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            lines = "".join(json.dumps(_span_record(span)) + "\n" for span in spans)
            with lock, open(path, "a", encoding="utf-8") as out:
                out.write(lines)
            return SpanExportResult.SUCCESS

    return JsonLinesExporter()


def _span_record(span: Any) -> dict[str, Any]:
    context = span.context
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
        "links": [f"{link.context.span_id:016x}" for link in span.links],
        "service": span.resource.attributes.get("service.name"),
        "pid": os.getpid(),
        "attributes": dict(span.attributes or {}),
    }


def _setup() -> Any:
    """This process's tracer, made on first use (after any fork, so no exporter thread is lost).
    None when the OpenTelemetry packages are missing: tracing is then off, said once."""
    global _tracer, ON
    with _setup_lock:
        if _tracer is not None or not ON:
            return _tracer
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        except ImportError:
            log.warning("tracing_off", reason="install vllm-srun[otel] to export traces")
            ON = False
            return None
        # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES apply (Resource.create reads them); the
        # SDK's "unknown_service" stands only for a name nobody gave.
        resource = Resource.create()
        if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
            resource = resource.merge(Resource({"service.name": "vllm-srun"}))
        provider = TracerProvider(resource=resource)
        trace_file = os.environ.get(TRACE_FILE_ENV)
        if trace_file:
            # Written as each span ends: a process stopped by a signal loses none.
            provider.add_span_processor(SimpleSpanProcessor(_json_lines_exporter(trace_file)))
        if os.environ.get(OTLP_ENV):
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            except ImportError:
                log.warning("otlp_export_off", reason="install vllm-srun[otel] for the OTLP exporter")
            else:
                provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        _tracer = provider.get_tracer("vllm_srun")
        return _tracer


def _kind(kind: str | None) -> Any:
    from opentelemetry.trace import SpanKind

    return SpanKind[kind.upper()] if kind else SpanKind.INTERNAL


def span(
    name: str,
    *,
    kind: str | None = None,
    parent: Any = None,
    links: Sequence[Any] = (),
    **attrs: Any,
) -> Any:
    """A context manager for a span named `name`, current while it is open, yielding an object
    with `set(**attrs)`. `kind`: "server", "client", "producer", "consumer" (else internal);
    `parent`: a context from `extract` or `current` (else the current span); `links`: more of
    them. Attribute names without a dot get the `srun.` prefix. Off: a shared no-op."""
    if not ON:
        return _NO_SPAN
    return _span(name, kind, parent, links, attrs)


@contextmanager
def _span(
    name: str, kind: str | None, parent: Any, links: Sequence[Any], attrs: dict[str, Any]
) -> Iterator[Any]:
    tracer = _setup()
    if tracer is None:
        yield _NO_SPAN
        return
    from opentelemetry.trace import Link, get_current_span

    span_links = [Link(get_current_span(c).get_span_context()) for c in links if c is not None]
    with tracer.start_as_current_span(
        name, context=parent, kind=_kind(kind), links=span_links, attributes=_attributes(attrs)
    ) as otel_span:
        yield _Span(otel_span)


def start(name: str, *, kind: str | None = None, **attrs: Any) -> Any:
    """A span started now but not made current (its children are its siblings' business);
    end it with `.end(**attrs)`, which is safe to call more than once. Off: a shared no-op."""
    if not ON:
        return _NO_SPAN
    tracer = _setup()
    if tracer is None:
        return _NO_SPAN
    return _Span(tracer.start_span(name, kind=_kind(kind), attributes=_attributes(attrs)))


def current() -> Any:
    """The current context, to parent or link a span made later elsewhere (None when off)."""
    if not ON:
        return None
    from opentelemetry.context import get_current

    return get_current()


def inject() -> dict[str, str] | None:
    """The current trace context as W3C headers (`traceparent`, `tracestate`), for a job to
    carry; None when off or outside any span."""
    if not ON:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier or None


def extract(carrier: Mapping[str, str] | None) -> Any:
    """The context `carrier` (from `inject`, or a request's headers) names; None when off or
    when it names none, so a span started with it as parent starts a new trace."""
    if not ON or not carrier:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract(carrier)
