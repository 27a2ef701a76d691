"""Load shapes over real HTTP on loopback, as users call the server.

Each shape is a coroutine that takes a server URL and texts and returns an `Outcome`. Closed
loops: `concurrency` callers each send their next request as soon as the last one answered.
Every loop is bounded by its inputs and by a deadline; requests still open at the deadline run
to their own timeout. Requests go through `bench.http1` (a keep-alive HTTP/1.1 client that
costs far less CPU than httpx) and responses are decoded with msgspec, so the client takes as
little as it can from a 2-core machine; each is checked: one embedding per text.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgspec

from bench import http1
from bench.ceiling import latency_ms
from bench.corpus import warm_texts
from vllm_srun.client import TERMINAL, AsyncClient, next_offset

REQUEST_TIMEOUT_S = 120.0
EMBEDDINGS = "/v1/embeddings"  # another server's OpenAI-shaped route is passed as `path`
JOB_POLL_S = 0.05
IDLE_HITS = 128

# The CPU seconds of the server's event loop so far (set by the bench around a shape; None when
# not known): a closed loop reports that CPU per request over its measured part.
server_cpu_s: Callable[[], float | None] | None = None


@dataclass
class Outcome:
    """What one shape measured: per-request latencies, Server-Timing totals, errors, CPU."""

    texts: int = 0
    requests: int = 0
    seconds: float = 0.0
    latencies_s: list[float] = field(default_factory=list)
    server_timing_ms: dict[str, list[float]] = field(default_factory=dict)
    errors: int = 0
    first_error: str | None = None
    client_cpu_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def fail(self, count: int, message: str) -> None:
        self.errors += count
        self.first_error = self.first_error or message[:300]

    def summary(self) -> dict[str, Any]:
        return {
            "texts": self.texts,
            "requests": self.requests,
            "seconds": round(self.seconds, 3),
            "texts_per_s": self.texts / self.seconds if self.seconds > 0 else 0.0,
            **latency_ms(self.latencies_s),
            "server_timing_p50_ms": {
                k: latency_ms([v / 1000 for v in vs])["p50_ms"] for k, vs in self.server_timing_ms.items()
            },
            "server_total_p50_ms": latency_ms([v / 1000 for v in self.server_timing_ms.get("total", [])])[
                "p50_ms"
            ],
            "errors": self.errors,
            "first_error": self.first_error,
            "client_cpu_s": round(self.client_cpu_s, 3),
            **self.extra,
        }


def server_timing(response: http1.Response) -> dict[str, float]:
    """The Server-Timing header's parts (`tokenize`, `queue`, `forward`, `total`), in ms."""
    parts = {}
    for part in response.headers.get("server-timing", "").split(","):
        name, _, rest = part.strip().partition(";")
        if rest.startswith("dur="):
            parts[name] = float(rest[4:])
    return parts


def http_client(url: str) -> http1.Client:
    """Persistent connections, one per caller in flight."""
    return http1.Client(url, timeout_s=REQUEST_TIMEOUT_S)


def _hit(body: dict[str, Any]) -> bool:
    return bool((body.get("meta") or {}).get("cache", {}).get("hits"))


async def embed(
    client: http1.Client,
    texts: list[str],
    encoding: str,
    out: Outcome,
    hits: Outcome | None = None,
    path: str = EMBEDDINGS,
) -> bool:
    """One POST to `path` (/v1/embeddings), timed and checked into `out`. With `hits`, the request
    asks for `meta`, and a cache hit's latency and Server-Timing are recorded in `hits` as well."""
    body: dict[str, Any] = {"input": texts, "encoding_format": encoding}
    if hits is not None:
        body["options"] = {"return_meta": True}
    started = time.perf_counter()
    try:
        response = await client.post(
            path, content=msgspec.json.encode(body), headers={"content-type": "application/json"}
        )
    except http1.HTTPError as exc:
        out.fail(len(texts), str(exc))
        return False
    elapsed = time.perf_counter() - started
    out.requests += 1
    if response.status_code != 200:
        out.fail(len(texts), f"HTTP {response.status_code}: {response.text}")
        return False
    decoded: dict[str, Any] = msgspec.json.decode(response.content)
    data = decoded.get("data") or []
    bad = len(texts) - sum(1 for item in data if item.get("embedding") is not None)
    if bad:
        out.fail(bad, f"{bad} inputs without an embedding: {str(data)[:200]}")
    out.texts += len(texts) - bad
    timing = server_timing(response)
    for record in (out, hits) if hits is not None and _hit(decoded) else (out,):
        record.latencies_s.append(elapsed)
        for name, ms in timing.items():
            record.server_timing_ms.setdefault(name, []).append(ms)
    return not bad


METRICS = {
    "batches": "vllm_srun_batch_size_count",
    "rows": "vllm_srun_batch_size_sum",
    "forward_s": "vllm_srun_forward_seconds_sum",
    "tokens": "vllm_srun_batch_tokens_total",
}


async def batch_counters(url: str) -> dict[str, float]:
    """The server's batch counters from /metrics, summed over models ({} when unavailable)."""
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            text = (await client.get("/metrics")).text
    except httpx.HTTPError:
        return {}
    out = dict.fromkeys(METRICS, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        for key, metric in METRICS.items():
            if name == metric:
                out[key] += float(line.rsplit(" ", 1)[1])
    return out


def batch_summary(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, Any]:
    """What the worker did during a shape: batches, mean rows, and the share of the shape's wall
    time spent in forwards (below 1: the device waited for work)."""
    if not before or not after:
        return {}
    d = {key: after[key] - before[key] for key in METRICS}
    return {
        "batches": int(d["batches"]),
        "mean_rows": d["rows"] / d["batches"] if d["batches"] else None,
        "forward_s": round(d["forward_s"], 3),
        "forward_busy": d["forward_s"] / seconds if seconds else None,
        "forward_texts_per_s": d["rows"] / d["forward_s"] if d["forward_s"] else None,
    }


async def _closed_loop(
    url: str,
    batches: list[list[str]],
    concurrency: int,
    encoding: str,
    deadline: float,
    path: str = EMBEDDINGS,
) -> Outcome:
    out = Outcome()
    queue = iter(batches)
    async with http_client(url) as client:

        async def caller() -> None:
            for batch in queue:  # the callers share one iterator: each batch is sent once
                if time.monotonic() > deadline:
                    out.extra["stopped_at_deadline"] = True
                    return
                await embed(client, batch, encoding, out, path=path)

        loop_cpu = server_cpu_s() if server_cpu_s else None
        cpu, started = time.process_time(), time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(concurrency)))
        out.seconds, out.client_cpu_s = time.perf_counter() - started, time.process_time() - cpu
        loop_cpu_after = server_cpu_s() if server_cpu_s else None
        if loop_cpu is not None and loop_cpu_after is not None and out.requests:
            # The app's and an embedded worker's event loop, forwards apart (their own threads).
            out.extra["loop_cpu_ms_per_request"] = (loop_cpu_after - loop_cpu) * 1000 / out.requests
    return out


async def warm(url: str, concurrency: int, encoding: str, round_: int, path: str = EMBEDDINGS) -> None:
    """Traffic on texts that no shape measures: the code paths, connections and batch shapes."""
    texts = warm_texts(max(64, 2 * concurrency), round_=round_)
    deadline = time.monotonic() + 120
    await _closed_loop(url, [[t] for t in texts], concurrency, encoding, deadline, path)
    batches = [texts[i : i + 64] for i in range(0, len(texts), 64)]
    await _closed_loop(url, batches, 4, encoding, deadline, path)


async def closed_loop(
    url: str,
    texts: list[str],
    *,
    concurrency: int,
    per_request: int,
    encoding: str,
    timeout_s: float,
    path: str = EMBEDDINGS,
    ours: bool | None = None,
) -> Outcome:
    """`concurrency` callers, each sending `per_request` texts per request until none are left.
    The batch counters come from vllm-srun's /metrics: only when `ours` (default: when `path` is
    its own route; vLLM serves the same route, and a /metrics without our counters)."""
    await warm(url, concurrency, encoding, round_=concurrency * 1000 + per_request, path=path)
    batches = [texts[i : i + per_request] for i in range(0, len(texts), per_request)]
    ours = path == EMBEDDINGS if ours is None else ours
    before = await batch_counters(url) if ours else {}
    out = await _closed_loop(url, batches, concurrency, encoding, time.monotonic() + timeout_s, path)
    if ours:
        out.extra["server_batches"] = batch_summary(before, await batch_counters(url), out.seconds)
    return out


async def cached(
    url: str, sequence: list[str], first: list[int], *, concurrency: int, encoding: str, timeout_s: float
) -> Outcome:
    """The repeat-heavy corpus, one text per request at `concurrency`; a repeat is sent only once
    its first occurrence has been answered, so it can be a hit. Hits are those whose `meta`
    counts one (a text joining another request's forward in flight counts as a miss there, so
    these are stored results only); their Server-Timing totals are the hit latency under load. Then up to IDLE_HITS
    repeats are sent again one at a time: the hit latency of the cache path alone."""
    await warm(url, concurrency, encoding, round_=7)
    deadline = time.monotonic() + timeout_s
    out, hits = Outcome(), Outcome()
    answered = [asyncio.Event() for _ in sequence]
    queue = iter(range(len(sequence)))
    before = await batch_counters(url)
    async with http_client(url) as client:

        async def caller() -> None:
            for i in queue:
                if time.monotonic() > deadline:
                    out.extra["stopped_at_deadline"] = True
                    return
                if first[i] != i:
                    remaining = max(0.0, deadline - time.monotonic())
                    try:
                        await asyncio.wait_for(answered[first[i]].wait(), remaining)
                    except TimeoutError:
                        return
                await embed(client, [sequence[i]], encoding, out, hits)
                answered[i].set()

        cpu, started = time.process_time(), time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(concurrency)))
        out.seconds, out.client_cpu_s = time.perf_counter() - started, time.process_time() - cpu
        out.extra["server_batches"] = batch_summary(before, await batch_counters(url), out.seconds)
        # The same hits again, one at a time once the load is over: the cache path alone.
        idle = Outcome()
        repeated = [sequence[i] for i, f in enumerate(first) if f != i][:IDLE_HITS]
        for text in repeated:
            if time.monotonic() > deadline + 60:
                break
            await embed(client, [text], encoding, Outcome(), idle)
    totals = hits.server_timing_ms.get("total", [])
    out.extra.update(
        repeats=sum(1 for i, f in enumerate(first) if f != i),
        hits=len(totals),
        hit_server_total=latency_ms([t / 1000 for t in totals]),
        # Where a hit's time goes under load, phase by phase (Server-Timing p50s).
        hit_server_timing_p50_ms=hits.summary()["server_timing_p50_ms"],
        hit_round_trip=latency_ms(hits.latencies_s),
        idle_hits=len(idle.latencies_s),
        idle_hit_server_total=latency_ms([t / 1000 for t in idle.server_timing_ms.get("total", [])]),
        idle_hit_round_trip=latency_ms(idle.latencies_s),
    )
    return out


async def bulk_job(url: str, texts: list[str], *, encoding: str, timeout_s: float) -> Outcome:
    """One job of `len(texts)` JSONL lines (one text each), waited on by polling its status every
    JOB_POLL_S, then every result fetched. Its latency is the job's: submit → last result read."""
    out = Outcome()
    async with AsyncClient(url, timeout_s=REQUEST_TIMEOUT_S) as client:
        await warm(url, 4, encoding, round_=9)
        warm_job = await client.submit_job(
            [{"input": t, "encoding_format": encoding} for t in warm_texts(32, round_=10)],
            surface="embeddings",
        )
        await _wait(client, warm_job["id"], time.monotonic() + 120)
        lines = [{"input": t, "encoding_format": encoding, "custom_id": str(i)} for i, t in enumerate(texts)]
        before = await batch_counters(url)
        cpu, started = time.process_time(), time.perf_counter()
        job = await client.submit_job(lines, surface="embeddings")
        submitted = time.perf_counter()
        status = await _wait(client, job["id"], time.monotonic() + timeout_s)
        completed = time.perf_counter()
        async for result in _results(url, job["id"]):
            if (result.get("response") or {}).get("data") and "error" not in result:
                out.texts += 1
            else:
                out.fail(1, str(result)[:300])
        out.seconds, out.client_cpu_s = time.perf_counter() - started, time.process_time() - cpu
    out.requests = len(texts)
    out.errors = len(texts) - out.texts
    out.latencies_s = [out.seconds]
    out.extra.update(
        server_batches=batch_summary(before, await batch_counters(url), out.seconds),
        status=status["status"],
        submit_s=round(submitted - started, 3),
        run_s=round(completed - submitted, 3),
        fetch_s=round(time.perf_counter() - completed, 3),
    )
    return out


async def _results(url: str, job_id: str, page_size: int = 1000) -> AsyncIterator[dict[str, Any]]:
    """Every result of a job, page by page, decoded with msgspec (the client's JSON decoding
    would otherwise be most of the fetch time on this machine)."""
    offset: int | None = 0
    async with http_client(url) as client:
        for _ in range(100_000):  # bounded: a page holds at least one result
            if offset is None:
                return
            response = await client.get(f"/v1/jobs/{job_id}/results?offset={offset}&limit={page_size}")
            if response.status_code != 200:
                raise http1.HTTPError(f"HTTP {response.status_code}: {response.text[:300]}")
            page = msgspec.json.decode(response.content)
            for result in page["data"]:
                yield result
            offset = next_offset(page)


async def _wait(client: AsyncClient, job_id: str, deadline: float) -> dict[str, Any]:
    while True:
        status = await client.job(job_id)
        if status["status"] in TERMINAL or time.monotonic() > deadline:
            return status
        await asyncio.sleep(JOB_POLL_S)


def run_async(coroutine: Any) -> Any:
    """uvloop where installed (it comes with the server): the client's own CPU stays small."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


ShapeRun = Callable[[str], Coroutine[Any, Any, Outcome]]
