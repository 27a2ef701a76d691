"""`python -m bench.soak --duration-s N`: hold a steady mix for N seconds; memory and latency flat.

The compose topology as processes on 127.0.0.1: a state Redis with its append-only file, a cache
Redis (allkeys-lru), two app replicas and two workers serving three small models (the example
keyword classifier, a tiny embedder and a tiny reranker). After a short capacity probe, an
open-loop mix runs at `--load` (0.8) of the measured rate: single and batch embeddings, rerank,
classify, repeats (cache hits), hostile rows at a low rate, and a bulk job with its event stream
every `--job-every-s`. Every `--sample-s` it samples each process's RSS and each Redis's
used_memory and key count. TTLs (results, jobs) equal the warm-up, so Redis holds a steady set.

Prints one JSON object whose `summary` holds lost, duplicated, unexpected_5xx, rss_growth_pct
per process (end of warm-up to end), redis used_memory_growth_pct, p99_ms per window, and
`failed_bounds`; exits 1 when a bound is missed (docs/soak.md states them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis

from bench import chaos
from bench.procs import HOST, Proc, free_port
from vllm_srun.cli.embedded_redis import find_redis_server

RSS_GROWTH_MAX_PCT = 5.0
REDIS_GROWTH_MAX_PCT = 25.0
# A job's data, results included, is kept an hour past its TTL (queue/jobs/store.py): over a
# run shorter than that it accumulates. So the state Redis is bounded per job whose data is still
# kept (its used_memory above the start's, over those jobs), and either Redis may grow this much
# past its percentage bound.
REDIS_GROWTH_SLACK_BYTES = 4 << 20
JOB_DATA_KEPT_PAST_TTL_S = 3600
P99_DRIFT_MAX = 1.2
# Requests in flight at most: past it the open loop skips a turn rather than queue without bound.
MAX_IN_FLIGHT = 64
KINDS = (  # (kind, weight): the steady mix
    ("classify", 25),
    ("embed_one", 20),
    ("embed_batch", 10),
    ("rerank", 15),
    ("repeat", 28),
    ("hostile", 0.3),  # a low rate: each costs a replica far more than a normal request
)


class CacheRedis(Proc):
    def __init__(self, port: int) -> None:
        self.port, self.url = port, f"redis://{HOST}:{port}/0"
        args = [find_redis_server(), "--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "no"]
        super().__init__([*args, "--maxmemory", "256mb", "--maxmemory-policy", "allkeys-lru"], "cache-redis")
        chaos._wait(lambda: chaos._pings(port), 30, "cache redis", self)


def write_models(root: Path) -> list[str]:
    """serve/worker arguments: three packages, named kw, emb and rr."""
    from vllm_sr_example.fixtures import write_fixture as write_keywords

    from vllm_srun.testing.task_heads_fixtures import write_fixture

    packages = [
        str(write_keywords(root / "kw")),
        str(write_fixture(root / "emb", variant="bert-embedding")),
        str(write_fixture(root / "rr", variant="bert-reranker")),
    ]
    return [*packages, *(f for name in ("kw", "emb", "rr") for f in ("--served-model-name", name))]


@dataclass
class Soak:
    state: chaos.DurableRedis
    cache: CacheRedis
    apps: list[Proc]
    workers: list[Proc]
    urls: list[str]

    @classmethod
    def start(cls, root: Path, ttl_s: int) -> Soak:
        data = root / "state"
        data.mkdir()
        state, cache = chaos.DurableRedis(data, free_port()), CacheRedis(free_port())
        models = write_models(root)
        common = ["--redis", state.url, "--cache-redis", cache.url, "--job-ttl-s", str(ttl_s)]
        common += ["--cache-ttl-s", str(ttl_s), "--log-level", "warning"]
        cli = [sys.executable, "-m", "vllm_srun.cli"]
        ports = [free_port() for _ in range(2)]
        apps = [
            Proc(
                [*cli, "serve", *models, *common, "--host", HOST, "--port", str(p), "--local-cache-mb", "4"],
                "app",
            )
            for p in ports
        ]
        workers = [Proc([*cli, "worker", *models, *common], "worker") for _ in range(2)]
        soak = cls(state, cache, apps, workers, [f"http://{HOST}:{p}" for p in ports])
        for app, url in zip(apps, soak.urls, strict=True):
            chaos._wait(lambda url=url: chaos._serves(url), 300, "app replica", app)
        return soak

    def processes(self) -> dict[str, int]:
        named = {f"app-{i}": p.pid for i, p in enumerate(self.apps)}
        named |= {f"worker-{i}": p.pid for i, p in enumerate(self.workers)}
        return named | {"redis-state": self.state.pid, "redis-cache": self.cache.pid}

    def stop(self) -> None:
        for proc in [*self.apps, *self.workers, self.state, self.cache]:
            proc.stop()


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


@dataclass
class Tally:
    sent: int = 0
    answered: int = 0
    expected_4xx: int = 0
    refused_503: int = 0
    unexpected: int = 0  # 5xx but 503, a 4xx from a good request, a failed connection
    skipped: int = 0  # the open loop's turns with MAX_IN_FLIGHT requests out
    resent: int = 0  # requests sent again once after a failed connection
    samples: list[str] = field(default_factory=list)
    latencies: list[tuple[float, float]] = field(default_factory=list)  # (when, seconds)
    jobs: int = 0
    items: int = 0
    items_lost: int = 0
    items_duplicated: int = 0
    memory: list[dict[str, Any]] = field(default_factory=list)
    job_created_s: list[float] = field(default_factory=list)  # each accepted job, from t0
    t0: float = 0.0  # time.monotonic() when the mix began


def request(
    kind: str, rng: random.Random, sent: list[tuple[str, dict[str, Any]]]
) -> tuple[str, dict[str, Any]]:
    """(path, body) of one request of `kind`; `sent` keeps earlier ones for repeats."""
    n = rng.randrange(10**9)
    if kind == "repeat" and sent:
        return rng.choice(sent)
    if kind == "hostile":
        return rng.choice(
            [
                ("/v1/classify", {"model": "kw", "input": ["x"] * 5000}),  # past max inputs: 413
                ("/v1/embeddings", {"model": "emb", "input": 12}),  # wrong type: 4xx
                ("/v1/classify", {"model": "kw", "input": "refund " * 30_000}),  # 210 kB of text
            ]
        )
    if kind == "embed_one":
        call = ("/v1/embeddings", {"model": "emb", "input": f"parcel {n} arrived late"})
    elif kind == "embed_batch":
        call = ("/v1/embeddings", {"model": "emb", "input": [f"doc {n} part {i}" for i in range(8)]})
    elif kind == "rerank":
        docs = [f"answer {n + i} about refunds" for i in range(4)]
        call = ("/v1/rerank", {"model": "rr", "query": f"refund {n}", "documents": docs})
    else:
        call = ("/v1/classify", {"model": "kw", "input": f"{'refund ' * (1 + n % 40)}please {n}"})
    if len(sent) < 2000:
        sent.append(call)
    return call


async def one(
    http: httpx.AsyncClient, url: str, kind: str, call: tuple[str, dict[str, Any]], tally: Tally, t0: float
) -> None:
    started = time.monotonic()
    try:
        try:
            r = await http.post(url + call[0], json=call[1])
        except httpx.TransportError:
            # Sent again once, as a client of an idempotent API does: a kept-alive connection
            # the server closed as the request went out is the client's race, not a failure.
            tally.resent += 1
            r = await http.post(url + call[0], json=call[1])
    except httpx.HTTPError as exc:
        tally.unexpected += 1
        tally.samples.append(f"{kind}: {exc!r}"[:300])
        return
    if (r.status_code == 200 and kind != "hostile") or (
        kind == "hostile" and r.status_code in (200, 400, 413, 422)
    ):
        if kind == "hostile" and r.status_code != 200:
            tally.expected_4xx += 1
        else:
            tally.answered += 1
            tally.latencies.append((started - t0, time.monotonic() - started))
    elif r.status_code == 503:
        tally.refused_503 += 1
    else:
        tally.unexpected += 1
        if len(tally.samples) < 5:
            tally.samples.append(f"{kind} {r.status_code}: {r.text[:300]}")


async def drive(urls: list[str], tally: Tally, rate: float, until: float, seed: int, t0: float) -> None:
    """Open loop: one request every 1/rate seconds, whatever the answers take."""
    rng, sent = random.Random(seed), []
    kinds, weights = zip(*KINDS, strict=True)
    pending: set[asyncio.Task[None]] = set()
    limits = httpx.Limits(max_connections=MAX_IN_FLIGHT)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:
        next_at = time.monotonic()
        while time.monotonic() < until:
            kind = rng.choices(kinds, weights)[0]
            if len(pending) >= MAX_IN_FLIGHT:
                tally.skipped += 1
            else:
                tally.sent += 1
                task = asyncio.ensure_future(
                    one(http, urls[tally.sent % 2], kind, request(kind, rng, sent), tally, t0)
                )
                pending.add(task)
                task.add_done_callback(pending.discard)
            next_at += 1 / rate
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        await asyncio.gather(*pending)


async def capacity(urls: list[str], seconds: float) -> float:
    """Requests/s of the mix, closed loop with 8 clients: the rate the soak takes a share of."""
    tally = Tally()
    until = time.monotonic() + seconds

    async def loop(seed: int) -> None:
        rng, sent = random.Random(seed), []
        kinds, weights = zip(*KINDS[:-1], strict=True)
        async with httpx.AsyncClient(timeout=60) as http:
            while time.monotonic() < until:
                kind = rng.choices(kinds, weights)[0]
                await one(http, urls[seed % 2], kind, request(kind, rng, sent), tally, 0.0)

    await asyncio.gather(*(loop(seed) for seed in range(8)))
    return tally.answered / seconds


async def job(url: str, index: int, lines: int, tally: Tally) -> None:
    """A classify job of `lines` lines, its results read from its event stream to the end."""
    body = "\n".join(
        json.dumps({"input": [f"{'parcel ' * (1 + i % 30)}job {index} line {i}"]}) for i in range(lines)
    )
    async with httpx.AsyncClient(timeout=60) as http:
        r = await http.post(
            f"{url}/v1/jobs?surface=classify&model=kw",
            content=body,
            headers={"content-type": "application/x-ndjson"},
        )
        if r.status_code != 202:
            tally.unexpected += 1
            tally.samples.append(f"job {r.status_code}: {r.text[:300]}")
            return
        tally.jobs, tally.items = tally.jobs + 1, tally.items + lines
        tally.job_created_s.append(time.monotonic() - tally.t0)
        seen: list[int] = []
        status, last_id = None, None
        while status is None:
            headers = {"last-event-id": last_id} if last_id else {}
            try:
                async with http.stream(
                    "GET", f"{url}/v1/jobs/{r.json()['id']}/events", headers=headers
                ) as events:
                    event = None
                    async for line in events.aiter_lines():
                        if line.startswith("id:"):
                            last_id = line[3:].strip()
                        elif line.startswith("event:"):
                            event = line[6:].strip()
                        elif line.startswith("data:") and event == "result":
                            seen.append(json.loads(line[5:])["index"])
                        elif line.startswith("data:") and event == "status":
                            status = json.loads(line[5:])["status"]
                            break
            except httpx.HTTPError:
                await asyncio.sleep(0.5)
        tally.items_lost += lines - len(set(seen))
        tally.items_duplicated += len(seen) - len(set(seen))


async def jobs(urls: list[str], tally: Tally, every_s: float, lines: int, until: float) -> None:
    running: list[asyncio.Task[None]] = []
    index = 0
    while time.monotonic() < until:
        running.append(asyncio.ensure_future(job(urls[index % 2], index, lines, tally)))
        index += 1
        await asyncio.sleep(every_s)
    await asyncio.gather(*running)


async def sample(soak: Soak, tally: Tally, every_s: float, until: float, t0: float) -> None:
    clients = {"state": redis.Redis.from_url(soak.state.url), "cache": redis.Redis.from_url(soak.cache.url)}
    while time.monotonic() < until:
        row: dict[str, Any] = {"t_s": round(time.monotonic() - t0, 1)}
        row["rss"] = {name: rss_bytes(pid) for name, pid in soak.processes().items()}
        for name, client in clients.items():
            info = await asyncio.to_thread(client.info, "memory")
            row[f"redis_{name}"] = {
                "used_memory": info["used_memory"],
                "keys": await asyncio.to_thread(client.dbsize),
            }
        tally.memory.append(row)
        await asyncio.sleep(every_s)


def growth_pct(first: float, last: float) -> float:
    return round(100 * (last - first) / first, 2) if first else 0.0


def per_kept_job(tally: Tally, keep_s: float) -> Any:
    """A sample row's state-Redis bytes above the first sample's, per job whose data is still
    kept at that time (None before the first job)."""
    base = tally.memory[0]["redis_state"]["used_memory"] if tally.memory else 0

    def of(row: dict[str, Any]) -> float | None:
        kept = sum(1 for made in tally.job_created_s if row["t_s"] - keep_s < made <= row["t_s"])
        return (row["redis_state"]["used_memory"] - base) / kept if kept else None

    return of


def summarize(
    tally: Tally,
    args: argparse.Namespace,
    warmup_s: float,
    rate: float,
    capacity_rps: float,
    keep_s: float = JOB_DATA_KEPT_PAST_TTL_S,
) -> dict[str, Any]:
    windows = max(2, int((args.duration_s - warmup_s) // args.window_s))
    span = (args.duration_s - warmup_s) / windows
    after = [row for row in tally.memory if row["t_s"] >= warmup_s] or tally.memory[-1:]
    # Each end is the median of its window's samples: one sample catches a job's lines in flight.
    first = [row for row in after if row["t_s"] < warmup_s + span] or after[:1]
    last = [row for row in after if row["t_s"] >= args.duration_s - span] or after[-1:]

    def grown(pick: Any) -> float:
        return growth_pct(statistics.median(map(pick, first)), statistics.median(map(pick, last)))

    rss = {name: grown(lambda row, n=name: row["rss"][n]) for name in after[0]["rss"]}
    redis_growth = {
        name: grown(lambda row, n=name: row[f"redis_{n}"]["used_memory"]) for name in ("state", "cache")
    }
    redis_grown_bytes = {
        name: statistics.median(row[f"redis_{name}"]["used_memory"] for row in last)
        - statistics.median(row[f"redis_{name}"]["used_memory"] for row in first)
        for name in ("state", "cache")
    }
    p99 = []
    for w in range(windows):
        took = sorted(s for t, s in tally.latencies if warmup_s + w * span <= t < warmup_s + (w + 1) * span)
        p99.append(round(1000 * took[min(len(took) - 1, int(0.99 * len(took)))], 1) if took else None)
    lost = tally.items_lost
    failed = []
    if lost:
        failed.append("lost")
    if tally.items_duplicated:
        failed.append("duplicated")
    if tally.unexpected:
        failed.append("unexpected_5xx")
    failed += [
        f"rss_growth_pct[{n}]" for n, g in rss.items() if g > RSS_GROWTH_MAX_PCT and not n.startswith("redis")
    ]
    # With bulk jobs in the mix, the state Redis is held to its bytes per kept job instead.
    of = per_kept_job(tally, keep_s)
    per_job = [[v for v in map(of, rows) if v is not None] for rows in (first, last)]
    state_per_job = None
    if all(per_job):
        ends = [statistics.median(v) for v in per_job]
        state_per_job = {"first": int(ends[0]), "last": int(ends[1]), "growth_pct": growth_pct(*ends)}
    failed += [
        f"used_memory_growth_pct[{n}]"
        for n, g in redis_growth.items()
        if g > REDIS_GROWTH_MAX_PCT
        and redis_grown_bytes[n] > REDIS_GROWTH_SLACK_BYTES
        and not (n == "state" and state_per_job is not None)
    ]
    if (
        state_per_job is not None
        and state_per_job["growth_pct"] > REDIS_GROWTH_MAX_PCT
        and redis_grown_bytes["state"] > REDIS_GROWTH_SLACK_BYTES
    ):
        failed.append("used_memory_per_kept_job_growth_pct[state]")
    if p99[0] and p99[-1] and p99[-1] > P99_DRIFT_MAX * p99[0]:
        failed.append("p99_ms drift")
    return {
        "duration_s": args.duration_s,
        "warmup_s": warmup_s,
        "capacity_rps": round(capacity_rps, 1),
        "rate_rps": round(rate, 1),
        "requests": tally.sent,
        "answered": tally.answered,
        "hostile_refused_4xx": tally.expected_4xx,
        "refused_503": tally.refused_503,
        "skipped_turns": tally.skipped,
        "resent_after_connection_error": tally.resent,
        "jobs": tally.jobs,
        "job_items": tally.items,
        "lost": lost,
        "duplicated": tally.items_duplicated,
        "unexpected_5xx": tally.unexpected,
        "rss_growth_pct": rss,
        "rss_mib_end": {n: round(b / 2**20, 1) for n, b in last[-1]["rss"].items()},
        "redis_used_memory_growth_pct": redis_growth,
        "redis_used_memory_growth_bytes": {n: int(b) for n, b in redis_grown_bytes.items()},
        "redis_keys_end": {n: last[-1][f"redis_{n}"]["keys"] for n in ("state", "cache")},
        "redis_state_bytes_per_kept_job": state_per_job,
        "p99_ms": p99,
        "bounds": {
            "rss_growth_pct_max": RSS_GROWTH_MAX_PCT,
            "redis_used_memory_growth_pct_max": REDIS_GROWTH_MAX_PCT,
            "redis_used_memory_growth_slack_bytes": REDIS_GROWTH_SLACK_BYTES,
            "last_window_p99_max_x_first": P99_DRIFT_MAX,
        },
        "failed_bounds": failed,
    }


async def run(soak: Soak, args: argparse.Namespace, tally: Tally) -> dict[str, Any]:
    capacity_rps = await capacity(soak.urls, args.capacity_s)
    rate = max(1.0, args.load * capacity_rps)
    t0 = tally.t0 = time.monotonic()
    until = t0 + args.duration_s
    warmup_s = args.warmup_frac * args.duration_s
    await asyncio.gather(
        drive(soak.urls, tally, rate, until, 0, t0),
        jobs(soak.urls, tally, args.job_every_s, args.job_lines, until),
        sample(soak, tally, args.sample_s, until + 0.01, t0),
    )
    keep_s = job_ttl_s(args) + JOB_DATA_KEPT_PAST_TTL_S
    return summarize(tally, args, warmup_s, rate, capacity_rps, keep_s)


def job_ttl_s(args: argparse.Namespace) -> int:
    """The result cache's and the jobs' TTL: the warm-up, so every bounded store fills in it."""
    return max(5, int(args.warmup_frac * args.duration_s))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n")[0])
    parser.add_argument("--duration-s", type=float, default=120.0, help="how long the mix runs")
    parser.add_argument("--warmup-frac", type=float, default=1 / 3, help="share of the run that is warm-up")
    parser.add_argument("--load", type=float, default=0.8, help="share of the measured capacity to run at")
    parser.add_argument("--capacity-s", type=float, default=10.0, help="how long the capacity probe runs")
    parser.add_argument("--window-s", type=float, default=30.0, help="latency window (at least two)")
    parser.add_argument("--sample-s", type=float, default=2.0, help="seconds between memory samples")
    parser.add_argument("--job-every-s", type=float, default=10.0, help="seconds between bulk jobs")
    parser.add_argument("--job-lines", type=int, default=200, help="lines in each bulk job")
    args = parser.parse_args(argv)
    ttl_s = job_ttl_s(args)
    with tempfile.TemporaryDirectory(prefix="vllm-srun-soak-") as root:
        soak = Soak.start(Path(root), ttl_s)
        tally = Tally()
        try:
            summary = asyncio.run(run(soak, args, tally))
        finally:
            soak.stop()
    print(json.dumps({"summary": summary, "samples": tally.samples, "memory": tally.memory}))
    return 1 if summary["failed_bounds"] else 0


if __name__ == "__main__":
    sys.exit(main())
