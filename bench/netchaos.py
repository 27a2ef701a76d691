"""`python -m bench.chaos --faults network`: the topology's Redis links lag, reset and partition.

The topology of `bench.chaos` (a durable main Redis, two app replicas, two workers), each
process reaching Redis through its own fault proxy (`vllm_srun.testing.netfault`), under the
same interactive clients and bulk jobs, through these phases in turn, each healed after:

1. every link 200 ms ± 100 ms late for `--phase-s`;
2. every connection reset every `--reset-every-s`, for `--phase-s`;
3. one worker's link blackholed for `--blackhole-s`;
4. one app replica's link blackholed for `--blackhole-s`.

Counted as `bench.chaos` counts, plus *hung*: a request attempt that took longer than its
deadline and a margin. Prints one JSON object (`summary`, `phases`, `events`); exits 1 unless
lost, wrong, duplicated, hung and unexpected 5xx are all 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench import chaos
from bench.procs import free_port
from vllm_srun.testing.netfault import ThreadedProxy

# Each interactive attempt's own deadline (options.deadline_ms), and the margin past it after
# which an attempt counts as hung: an answer or a 503 must come by then.
ATTEMPT_DEADLINE_MS = 10_000
HUNG_MARGIN_S = 2.0


@dataclass
class Links:
    apps: list[ThreadedProxy]
    workers: list[ThreadedProxy]

    @property
    def all(self) -> list[ThreadedProxy]:
        return [*self.apps, *self.workers]

    def heal(self) -> None:
        for link in self.all:
            link.heal()


@dataclass
class Attempts:
    """Every interactive attempt: its status (0: the connection failed) and how long it took."""

    taken: list[tuple[int, float]] = field(default_factory=list)

    def hung(self) -> int:
        return sum(1 for _, took in self.taken if took > ATTEMPT_DEADLINE_MS / 1000 + HUNG_MARGIN_S)


def start(model: str, data: Path) -> tuple[chaos.Topology, Links]:
    redis = chaos.DurableRedis(data, free_port())
    upstream = ("127.0.0.1", redis.port)
    links = Links([ThreadedProxy(upstream) for _ in range(2)], [ThreadedProxy(upstream) for _ in range(2)])
    topo = chaos.Topology(model, data, redis)
    topo.apps = [chaos.App(model, link.url, free_port()) for link in links.apps]
    topo.workers = [chaos.Worker(model, link.url) for link in links.workers]
    for app in topo.apps:
        chaos._wait(lambda app=app: chaos._serves(app.url), 180, "app replica", app)
    return topo, links


async def client(
    topo: chaos.Topology, tally: chaos.Tally, attempts: Attempts, until: float, seed: int
) -> None:
    """As `chaos.client`, each attempt with its own deadline and timed."""
    rng = random.Random(seed)
    async with httpx.AsyncClient(timeout=ATTEMPT_DEADLINE_MS / 1000 + 30) as http:
        while time.monotonic() < until:
            texts, labels = chaos.request_for(rng)
            tally.sent += 1
            started = time.monotonic()
            deadline = started + chaos.REQUEST_DEADLINE_S
            outcome = None
            turn = seed + tally.sent
            while time.monotonic() < deadline:
                app = topo.apps[turn % len(topo.apps)]
                turn += 1
                body = {"input": texts, "options": {"deadline_ms": ATTEMPT_DEADLINE_MS}}
                tried = time.monotonic()
                try:
                    r = await http.post(f"{app.url}/v1/classify", json=body)
                except httpx.HTTPError:
                    attempts.taken.append((0, time.monotonic() - tried))
                    tally.connection_failures += 1
                    await asyncio.sleep(chaos.RETRY_PAUSE_S)
                    continue
                attempts.taken.append((r.status_code, time.monotonic() - tried))
                items_late = r.status_code == 200 and any("error" in x for x in r.json()["results"])
                if r.status_code == 503 or items_late:
                    tally.refused_503 += 1  # refused, or past its deadline: sent again
                    await asyncio.sleep(chaos.RETRY_PAUSE_S)
                    continue
                outcome = r
                break
            if outcome is None:
                tally.lost += 1
            elif outcome.status_code == 200:
                got = [x.get("label") for x in outcome.json()["results"]]
                if got == labels:
                    tally.answered += 1
                    tally.latencies_s.append(time.monotonic() - started)
                else:
                    tally.wrong += 1
            else:
                tally.unexpected_5xx += 1
                if len(tally.samples) < 3:
                    when = f"{time.monotonic() - topo.started:.1f}s"
                    tally.samples.append(f"{when} {outcome.status_code}: {outcome.text[:300]}")


def phases(args: argparse.Namespace, links: Links) -> list[tuple[str, float, Any]]:
    """(name, seconds, what starts it) for each fault; each is healed after its seconds."""

    def lag() -> None:
        for link in links.all:
            link.delay(0.2, 0.1)

    def resets() -> None:
        for link in links.all:
            link.reset_every(args.reset_every_s)

    return [
        ("latency 200±100 ms on every link", args.phase_s, lag),
        (f"every connection reset every {args.reset_every_s:g} s", args.phase_s, resets),
        ("worker 0's link blackholed", args.blackhole_s, links.workers[0].blackhole),
        ("app replica 0's link blackholed", args.blackhole_s, links.apps[0].blackhole),
    ]


async def run_phases(
    topo: chaos.Topology, links: Links, args: argparse.Namespace, tally: chaos.Tally, attempts: Attempts
) -> list[dict[str, Any]]:
    plan = phases(args, links)
    total = sum(seconds + args.calm_s for _, seconds, _ in plan) + args.calm_s
    until = time.monotonic() + total
    traffic = [
        asyncio.ensure_future(client(topo, tally, attempts, until, seed)) for seed in range(args.clients)
    ]
    jobs_task = asyncio.ensure_future(
        chaos.submitter(topo, tally, until, args.job_every_s, args.job_lines, (0.0, 0.0))
    )
    done: list[dict[str, Any]] = []
    await asyncio.sleep(args.calm_s)
    for name, seconds, begin in plan:
        before = len(attempts.taken)
        await asyncio.to_thread(begin)
        topo.note(f"{name}: begins")
        await asyncio.sleep(seconds)
        await asyncio.to_thread(links.heal)
        topo.note(f"{name}: healed")
        await asyncio.sleep(args.calm_s)
        during = attempts.taken[before:]
        done.append(
            {
                "fault": name,
                "seconds": seconds,
                "attempts": len(during),
                "refused_503": sum(1 for status, _ in during if status == 503),
                "slowest_attempt_ms": round(1000 * max((t for _, t in during), default=0.0)),
            }
        )
    await asyncio.gather(*traffic)
    jobs = await jobs_task
    topo.note(f"traffic stopped; waiting for {len(jobs)} jobs")
    await chaos.settle(topo, tally, jobs, args.settle_s)
    return done


def unhandled(topo: chaos.Topology) -> list[str]:
    """The first unhandled errors the app replicas logged, with their tracebacks."""
    found = []
    for app in topo.apps:
        text = app.log_path.read_text(errors="replace")
        at = text.find("unhandled_error")
        if at >= 0:
            found.append(text[at : at + 4000])
    return found


def main(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="vllm-srun-netchaos-") as root:
        data = Path(root) / "redis-data"
        data.mkdir()
        topo, links = start(args.model or chaos.default_model(Path(root)), data)
        tally, attempts = chaos.Tally(), Attempts()
        try:
            topo.note("topology serving, each process behind its own fault proxy; traffic starts")
            done = asyncio.run(run_phases(topo, links, args, tally, attempts))
            errors = unhandled(topo)
        finally:
            topo.stop()
            for link in links.all:
                link.close()
    summary = {
        "lost": tally.lost + tally.items_lost,
        "duplicated": tally.items_duplicated,
        "unexpected_5xx": tally.unexpected_5xx,
        "wrong": tally.wrong,
        "hung": attempts.hung(),
        "requests": tally.sent,
        "answered": tally.answered,
        "refused_503_sent_again": tally.refused_503,
        "connection_failures_sent_again": tally.connection_failures,
        "p99_ms": round(tally.p99_ms(), 1),
        "jobs": tally.jobs,
        "job_items": tally.items_sent,
        "job_items_answered": tally.items_answered,
    }
    failures = sum(summary[k] for k in ("lost", "duplicated", "unexpected_5xx", "wrong", "hung"))
    summary["ok"] = failures == 0
    report = {"summary": summary, "phases": done, "events": topo.events, "samples": tally.samples}
    print(json.dumps(report | {"app_errors": errors}, indent=2))
    return 0 if failures == 0 else 1
