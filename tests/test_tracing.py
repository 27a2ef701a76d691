"""Traces across processes: one request's spans on the app replica and on the worker that ran
its job share one trace, through the trace context the queued job carries (vllm_srun/tracing.py).

Each process writes its finished spans to its own file through the `VLLM_SRUN_TRACE_FILE` hook.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import msgspec
import pytest
from helpers import RedisProcess, Server, start_worker, write_keywords

from vllm_srun.plugins.base import WorkItem
from vllm_srun.queue import protocol
from vllm_srun.tracing import OTLP_ENV, TRACE_FILE_ENV

# The caller's own trace: the request's span must join it.
CALLER_TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_PARENT = f"00-{CALLER_TRACE_ID}-00f067aa0ba902b7-01"
BULK_TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
BULK_PARENT = f"00-{BULK_TRACE_ID}-b7ad6b7169203331-01"


def spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def wait_for_span(path: Path, name: str, timeout_s: float = 15.0) -> list[dict[str, Any]]:
    """The spans in `path` once one named `name` is there (a worker ends its job span after it
    replied, so the reply can reach the caller first)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = spans(path)
        if any(s["name"] == name for s in found):
            return found
        assert time.monotonic() < deadline, f"no {name!r} span in {found}"
        time.sleep(0.05)


def one(found: list[dict[str, Any]], name: str) -> dict[str, Any]:
    named = [s for s in found if s["name"] == name]
    assert len(named) == 1, (name, [s["name"] for s in found])
    return named[0]


@pytest.mark.slow
def test_one_trace_covers_the_app_and_the_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("opentelemetry.sdk")
    monkeypatch.delenv(OTLP_ENV, raising=False)
    package = write_keywords(tmp_path / "keywords")
    app_file, worker_file = tmp_path / "app-spans.jsonl", tmp_path / "worker-spans.jsonl"
    redis = RedisProcess(tmp_path / "redis.log")
    monkeypatch.setenv(TRACE_FILE_ENV, str(worker_file))  # start_worker passes the environment on
    worker = start_worker(tmp_path, package, redis.url)
    app = Server(
        [str(package), "--redis", redis.url], tmp_path / "app.log", env={TRACE_FILE_ENV: str(app_file)}
    )
    try:
        app.wait_ready()
        response = app.post(
            "/v1/classify", {"input": "a refund for the parcel"}, headers={"traceparent": CALLER_PARENT}
        )
        assert response.status_code == 200, response.text
        wait_for_span(worker_file, "job")
        created = app.post(
            "/v1/jobs",
            {"surface": "classify", "requests": [{"input": "where is my parcel"}]},
            headers={"traceparent": BULK_PARENT},
        )
        assert created.status_code == 202, created.text
        worker_spans = wait_for_span(worker_file, "chunk")
        app_spans = wait_for_span(app_file, "POST /v1/classify")
    finally:
        app.stop()
        worker.stop()
        redis.stop()

    bulk_spans = [s for s in app_spans + worker_spans if s["trace_id"] == BULK_TRACE_ID]
    app_spans = [s for s in app_spans if s["trace_id"] != BULK_TRACE_ID]
    worker_spans = [s for s in worker_spans if s["trace_id"] != BULK_TRACE_ID]
    request = one(app_spans, "POST /v1/classify")
    assert request["kind"] == "SERVER"
    assert request["attributes"]["http.response.status_code"] == 200
    assert request["parent_id"] == CALLER_PARENT.split("-")[2]  # the caller's span
    for name in ("plan", "cache", "queue", "finish"):
        assert one(app_spans, name)["parent_id"] == request["span_id"], name
    queue = one(app_spans, "queue")
    assert queue["kind"] == "PRODUCER"

    job, batch, forward = (one(worker_spans, name) for name in ("job", "batch", "forward"))
    assert job["kind"] == "CONSUMER"
    assert job["parent_id"] == queue["span_id"]  # across the processes, through the job
    # A batch is a child of its first job's span and links every job it serves.
    assert batch["parent_id"] == job["span_id"]
    assert job["span_id"] in batch["links"]
    assert forward["parent_id"] == batch["span_id"]
    # Every span but the readiness polls' (each a trace of its own) is in the caller's trace.
    traced = [s for s in app_spans + worker_spans if s["name"] != "GET"]
    assert {s["trace_id"] for s in traced} == {CALLER_TRACE_ID}, traced
    assert {s["service"] for s in traced} == {"vllm-srun"}  # when OTEL_SERVICE_NAME names none
    assert {s["pid"] for s in app_spans}.isdisjoint({s["pid"] for s in worker_spans})

    # A bulk job's chunks carry the trace of the request that made the job.
    create, chunk = one(bulk_spans, "POST"), one(bulk_spans, "chunk")
    assert create["attributes"]["http.response.status_code"] == 202
    assert chunk["parent_id"] == create["span_id"]
    assert one(bulk_spans, "batch")["parent_id"] == chunk["span_id"]


NO_TRACING = textwrap.dedent(
    """
    import asyncio, sys
    from concurrent.futures import ThreadPoolExecutor

    import vllm_srun.cli.main, vllm_srun.app.main, vllm_srun.app.serving, vllm_srun.queue.worker.device_worker
    from vllm_srun import tracing
    from vllm_srun.plugins.base import WorkItem
    from vllm_srun.plugins.discovery import load_plugins
    from vllm_srun.plugins.stats import Stats
    from vllm_srun.queue.worker.coalescer import BatchLimits, Coalescer
    from vllm_srun.registry.loader import ModelOptions, load_model

    async def main():
        model, _ = load_model(load_plugins(), ModelOptions(ref=sys.argv[1], engine="example_counts"), with_engine=True)
        coalescer = Coalescer(model, limits=BatchLimits(), executor=ThreadPoolExecutor(1), stats=Stats([]))
        coalescer.start()
        with tracing.span("job", kind="consumer", parent=tracing.extract({"traceparent": "x"})) as job:
            job.set(items=1)
            assert tracing.inject() is None and tracing.current() is None
            await asyncio.gather(*coalescer.submit([WorkItem(token_ids=[1, 2], cache_key="k")]))
        tracing.start("cache").end(misses=0)
        await coalescer.close()

    asyncio.run(main())
    assert not tracing.ON
    loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
    assert not loaded, loaded
    print("untraced")
    """
)


def test_untraced_process_never_imports_opentelemetry(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in (OTLP_ENV, TRACE_FILE_ENV)}
    package = write_keywords(tmp_path / "keywords", "batching")
    run = subprocess.run(
        [sys.executable, "-c", NO_TRACING, str(package)], env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert "untraced" in run.stdout


def test_a_job_from_an_app_without_trace_context_still_decodes() -> None:
    """The trace field is last and optional: payloads of either age decode on either side."""
    job = protocol.JobPayload("kw", "sha", "float32", [WorkItem(token_ids=[1])], "reply", "r1", 1.0)
    old = msgspec.msgpack.encode(list(msgspec.msgpack.decode(protocol.encode(job)))[:-1])
    assert protocol.decode_job(old) == job
    traced = msgspec.structs.replace(job, trace={"traceparent": CALLER_PARENT})
    assert protocol.decode_job(protocol.encode(traced)).trace == {"traceparent": CALLER_PARENT}


def test_spans_go_out_over_otlp_when_the_endpoint_is_set(tmp_path: Path) -> None:
    """A real OTLP/HTTP exporter against a collector stand-in that decodes what it is sent."""
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    received: list[bytes] = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    env = {k: v for k, v in os.environ.items() if k != TRACE_FILE_ENV}
    env |= {OTLP_ENV: f"http://127.0.0.1:{server.server_port}", "OTEL_SERVICE_NAME": "srun-test"}
    script = "from vllm_srun import tracing\nwith tracing.span('plan', inputs=2):\n    pass\n"
    try:
        run = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
        )
    finally:
        server.shutdown()
    assert run.returncode == 0, run.stderr
    names, services = [], []
    for body in received:
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            services += [
                a.value.string_value for a in resource_spans.resource.attributes if a.key == "service.name"
            ]
            names += [span.name for scope in resource_spans.scope_spans for span in scope.spans]
    assert names == ["plan"]
    assert services == ["srun-test"]
