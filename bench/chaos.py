"""`python -m bench.chaos [--duration-s 120]`: mixed traffic over the process topology while
its processes are killed, and a count of what was lost (`--faults network`: its Redis links
misbehave instead, see bench/netchaos.py).

The topology is the one compose runs, as processes on 127.0.0.1: a main Redis with an
append-only file (`appendfsync everysec`), two app replicas (`serve --redis`) and two device
workers. For `--duration-s`, interactive clients send small classify requests and a bulk job is
submitted every `--job-every-s`, while:

- a worker is killed (SIGKILL) every `--worker-kill-every-s` and started again at once, as a
  supervisor would;
- one app replica is killed (SIGKILL) once and started again on its port;
- Redis is killed (SIGKILL) once and started again from its file on its port; with
  `--cluster`, the state is on a Redis Cluster of 3 masters and 3 replicas and the master of
  the bulk state's slot is killed instead: its replica is promoted (cluster-node-timeout 1 s),
  and the killed node is started again, to rejoin as a replica.

A client does what a well-behaved client of a replicated service does: a request refused with
503, or whose connection failed (its replica was killed), is sent again, to the other replica,
until its own deadline. Each logical request is then *answered* (200 with the right labels),
*wrong* (200 with other labels), *lost* (no 200 by its deadline) or ended by an *unexpected 5xx*
(any 5xx but 503). Bulk items are *answered* when the job's stored results hold them,
*lost* when missing or failed, and *duplicated* when the job counted more items than it holds.
Job submissions pause for the two seconds before the Redis kill: a job created within the
fsync second before a crash may be gone (docs/deployment.md, "A Redis restart"), which is a documented loss,
not the one this run looks for. Exits 1 unless lost, wrong, duplicated and unexpected 5xx are 0.

Everything listens on 127.0.0.1; traffic is bounded by `--clients` and the duration.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.procs import HOST, Proc, free_port
from vllm_srun.cli.embedded_redis import find_redis_server, free_cluster_port

REQUEST_DEADLINE_S = 60.0
RETRY_PAUSE_S = 0.2


class DurableRedis(Proc):
    """redis-server with an append-only file in `data`, on `port` (restartable there); with
    `cluster`, a Redis Cluster node (its node file in `data` too)."""

    def __init__(self, data: Path, port: int, *, cluster: bool = False) -> None:
        self.port = port
        self.url = f"redis://{HOST}:{port}/0"
        args = [find_redis_server(), "--port", str(port), "--bind", HOST, "--dir", str(data)]
        args += ["--appendonly", "yes", "--appendfsync", "everysec", "--save", ""]
        if cluster:
            args += ["--cluster-enabled", "yes", "--cluster-config-file", str(data / "nodes.conf")]
            args += ["--cluster-node-timeout", str(CLUSTER_NODE_TIMEOUT_MS)]
        super().__init__([*args, "--maxmemory-policy", "noeviction"], "redis")
        _wait(lambda: _pings(port), 30, "redis", self)


# A master silent this long is failed over to its replica.
CLUSTER_NODE_TIMEOUT_MS = 1000


class ClusterRedis:
    """The state on a Redis Cluster of 3 masters and 3 replicas, each node durable as above.
    `fail_over` SIGKILLs the master of the bulk state's slot, waits for its replica to be
    promoted and starts the killed node again on its port, where it rejoins as a replica."""

    def __init__(self, data: Path) -> None:
        import subprocess

        self.data = data
        self.nodes: list[DurableRedis] = []
        for _ in range(6):
            port = free_cluster_port(HOST)
            (data / str(port)).mkdir()
            self.nodes.append(DurableRedis(data / str(port), port, cluster=True))
        cli = str(Path(find_redis_server()).with_name("redis-cli"))
        addresses = [f"{HOST}:{node.port}" for node in self.nodes]
        subprocess.run(
            [cli, "--cluster", "create", *addresses, "--cluster-replicas", "1", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        _wait(lambda: all(self._ok(node.port) for node in self.nodes), 30, "the cluster", self.nodes[0])
        self.url = self.nodes[0].url
        self.port = self.nodes[0].port

    @staticmethod
    def _ok(port: int) -> bool:
        import redis

        try:
            info = redis.Redis(host=HOST, port=port, socket_timeout=1).execute_command("CLUSTER INFO")
        except redis.RedisError:
            return False
        return bool(info.get("cluster_state") == "ok")

    def master_of(self, key: str) -> DurableRedis:
        import redis

        for node in self.nodes:
            if not node.alive():
                continue
            try:
                client = redis.Redis(host=HOST, port=node.port, socket_timeout=1)
                slot = int(client.execute_command("CLUSTER KEYSLOT", key))
                for start, end, master, *_ in client.execute_command("CLUSTER SLOTS"):
                    if start <= slot <= end:
                        return next(n for n in self.nodes if n.port == int(master[1]))
            except redis.RedisError:
                continue
        raise RuntimeError("no cluster node answers")

    def fail_over(self, topo: Topology, down_s: float) -> None:
        from vllm_srun.queue import keys

        key = keys.job_key("any")  # every job's records and the quotas share this slot
        victim = self.master_of(key)
        kill(victim)
        topo.note(f"cluster master {victim.port} (the bulk state's slot) killed")
        deadline = time.monotonic() + 30
        while self.master_of(key) is victim:
            if time.monotonic() > deadline:
                raise RuntimeError("no replica was promoted")
            time.sleep(0.1)
        topo.note(f"its replica {self.master_of(key).port} promoted")
        time.sleep(down_s)
        victim.stop()
        index = self.nodes.index(victim)
        self.nodes[index] = DurableRedis(self.data / str(victim.port), victim.port, cluster=True)
        topo.note(f"node {victim.port} started again (a replica now)")

    def alive(self) -> bool:
        return all(node.alive() for node in self.nodes)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


class App(Proc):
    """`serve MODEL --redis URL` on `port`."""

    def __init__(self, model: str, redis_url: str, port: int) -> None:
        self.port = port
        self.url = f"http://{HOST}:{port}"
        args = [sys.executable, "-m", "vllm_srun.cli", "serve", model, "--redis", redis_url]
        super().__init__([*args, "--host", HOST, "--port", str(port), "--log-level", "warning"], "app")


class Worker(Proc):
    def __init__(self, model: str, redis_url: str) -> None:
        args = [sys.executable, "-m", "vllm_srun.cli", "worker", model, "--redis", redis_url]
        super().__init__([*args, "--log-level", "warning"], "worker")


def _pings(port: int) -> bool:
    import redis

    try:
        return bool(redis.Redis(host=HOST, port=port, socket_timeout=1).ping())
    except redis.RedisError:
        return False


def _serves(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _wait(ready: Any, timeout_s: float, what: str, proc: Proc) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if not proc.alive() or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start:\n{proc.log_tail()}")
        time.sleep(0.1)


def kill(proc: Proc) -> None:
    """SIGKILL: no cleanup, no lease given back (what a crash or the OOM killer does)."""
    if proc.alive():
        proc.proc.send_signal(signal.SIGKILL)
        proc.proc.wait()


@dataclass
class Topology:
    model: str
    data: Path
    redis: DurableRedis | ClusterRedis
    apps: list[App] = field(default_factory=list)
    workers: list[Worker] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    @classmethod
    def start(cls, model: str, data: Path, *, cluster: bool = False) -> Topology:
        redis = ClusterRedis(data) if cluster else DurableRedis(data, free_port())
        topo = cls(model, data, redis)
        topo.apps = [App(model, topo.redis.url, free_port()) for _ in range(2)]
        topo.workers = [Worker(model, topo.redis.url) for _ in range(2)]
        for app in topo.apps:
            _wait(lambda app=app: _serves(app.url), 180, "app replica", app)
        return topo

    def note(self, what: str) -> None:
        self.events.append(f"{time.monotonic() - self.started:7.1f}s  {what}")

    def restart_worker(self, index: int) -> None:
        kill(self.workers[index])
        self.workers[index].stop()
        self.workers[index] = Worker(self.model, self.redis.url)
        self.note(f"worker {index} killed and started again")

    def restart_app(self, index: int) -> None:
        old = self.apps[index]
        kill(old)
        old.stop()
        self.note(f"app replica {index} killed")
        self.apps[index] = App(self.model, self.redis.url, old.port)
        _wait(lambda: _serves(self.apps[index].url), 180, "app replica", self.apps[index])
        self.note(f"app replica {index} serving again")

    def restart_redis(self, down_s: float) -> None:
        if isinstance(self.redis, ClusterRedis):
            self.redis.fail_over(self, down_s)
            return
        kill(self.redis)
        self.redis.stop()
        self.note("redis killed")
        time.sleep(down_s)
        self.redis = DurableRedis(self.data, self.redis.port)
        self.note("redis started again from its append-only file")

    def stop(self) -> None:
        for proc in [*self.apps, *self.workers, self.redis]:
            proc.stop()


@dataclass
class Tally:
    sent: int = 0
    answered: int = 0
    wrong: int = 0
    lost: int = 0
    unexpected_5xx: int = 0
    refused_503: int = 0  # attempts, each sent again
    connection_failures: int = 0  # attempts, each sent again
    latencies_s: list[float] = field(default_factory=list)
    jobs: int = 0
    items_sent: int = 0
    items_answered: int = 0
    items_lost: int = 0
    items_duplicated: int = 0
    job_submissions_refused: int = 0
    samples: list[str] = field(default_factory=list)  # the first failures, as answered

    def p99_ms(self) -> float:
        if not self.latencies_s:
            return float("nan")
        ordered = sorted(self.latencies_s)
        return 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]

    def failures(self) -> int:
        return self.lost + self.wrong + self.unexpected_5xx + self.items_lost + self.items_duplicated


def request_for(rng: random.Random) -> tuple[list[str], list[str]]:
    """A classify input of 1-4 texts and the labels the keyword model gives them."""
    texts, labels = [], []
    for _ in range(rng.randint(1, 4)):
        # Mostly new inputs (cache misses), all within the model's token limit.
        k, extra = rng.randint(1, 120), rng.randint(0, 120)
        if rng.random() < 0.5:
            texts.append(f"{'refund ' * k}{'invoice ' * extra}please")
            labels.append("billing")
        else:
            texts.append(f"{'parcel ' * k}{'delivery ' * extra}please")
            labels.append("shipping")
    return texts, labels


async def client(topo: Topology, tally: Tally, until: float, seed: int) -> None:
    rng = random.Random(seed)
    async with httpx.AsyncClient(timeout=REQUEST_DEADLINE_S) as http:
        while time.monotonic() < until:
            texts, labels = request_for(rng)
            tally.sent += 1
            started = time.monotonic()
            outcome = await send(http, topo, tally, texts, seed + tally.sent)
            if outcome is None:
                tally.lost += 1
            elif outcome.status_code == 200:
                got = [r.get("label") for r in outcome.json()["results"]]
                if got == labels:
                    tally.answered += 1
                    tally.latencies_s.append(time.monotonic() - started)
                else:
                    tally.wrong += 1
                    if len(tally.samples) < 3:
                        tally.samples.append(f"wrong: {outcome.text[:300]}")
            else:
                tally.unexpected_5xx += 1
                if len(tally.samples) < 3:
                    tally.samples.append(f"{outcome.status_code}: {outcome.text[:300]}")


async def send(
    http: httpx.AsyncClient, topo: Topology, tally: Tally, texts: list[str], turn: int
) -> httpx.Response | None:
    """The request, sent again to the other replica on 503 or a failed connection, until its
    deadline; the final response (200 or an unexpected status), or None if none came."""
    deadline = time.monotonic() + REQUEST_DEADLINE_S
    while time.monotonic() < deadline:
        app = topo.apps[turn % len(topo.apps)]
        turn += 1
        try:
            r = await http.post(f"{app.url}/v1/classify", json={"input": texts})
        except httpx.HTTPError:
            tally.connection_failures += 1
            await asyncio.sleep(RETRY_PAUSE_S)
            continue
        if r.status_code == 503:
            tally.refused_503 += 1
            await asyncio.sleep(RETRY_PAUSE_S)
            continue
        if r.status_code == 200 or r.status_code >= 500:
            return r
        raise AssertionError(f"unexpected {r.status_code}: {r.text[:300]}")  # a bug in this bench
    return None


def job_lines(job: int, n: int) -> list[dict[str, Any]]:
    return [
        {
            "input": [f"{'refund ' * (1 + i % 61)}{'parcel ' * (1 + i // 61)}job{job}"],
            "custom_id": f"{job}-{i}",
        }
        for i in range(n)
    ]


async def submitter(
    topo: Topology, tally: Tally, until: float, every_s: float, lines: int, quiet: tuple[float, float]
) -> list[tuple[str, int]]:
    """Submit a job every `every_s` (none in the `quiet` window); the (id, size) of each."""
    jobs: list[tuple[str, int]] = []
    async with httpx.AsyncClient(timeout=60) as http:
        while time.monotonic() < until:
            if not quiet[0] <= time.monotonic() <= quiet[1]:
                body = "\n".join(json.dumps(line) for line in job_lines(len(jobs), lines))
                app = topo.apps[len(jobs) % len(topo.apps)]
                try:
                    r = await http.post(
                        f"{app.url}/v1/jobs?surface=classify",
                        content=body,
                        headers={"content-type": "application/x-ndjson"},
                    )
                except httpx.HTTPError:
                    r = None
                if r is not None and r.status_code == 202:
                    jobs.append((r.json()["id"], lines))
                    tally.jobs += 1
                    tally.items_sent += lines
                else:  # refused (503, or its replica was down): submitted again next turn
                    tally.job_submissions_refused += 1
                    await asyncio.sleep(1)
                    continue
            await asyncio.sleep(every_s)
    return jobs


async def settle(topo: Topology, tally: Tally, jobs: list[tuple[str, int]], timeout_s: float) -> None:
    """Wait for every job to finish, then count its items from its stored results."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=60) as http:
        for job_id, n in jobs:
            status: dict[str, Any] = {}
            while time.monotonic() < deadline:
                try:
                    r = await http.get(f"{topo.apps[0].url}/v1/jobs/{job_id}")
                    status = r.json() if r.status_code == 200 else {}
                except httpx.HTTPError:
                    status = {}
                if status.get("status") in ("completed", "failed", "cancelled", "expired"):
                    break
                await asyncio.sleep(0.5)
            r = await http.get(
                f"{topo.apps[0].url}/v1/jobs/{job_id}/results?limit={n}",
                headers={"accept": "application/x-ndjson"},
            )
            stored = [json.loads(line) for line in r.content.splitlines()] if r.status_code == 200 else []
            indices = {line["index"] for line in stored if "response" in line}
            tally.items_answered += len(indices)
            tally.items_lost += n - len(indices)
            counts = status.get("counts", {})
            tally.items_duplicated += max(0, counts.get("done", 0) + counts.get("failed", 0) - n)


async def chaos(topo: Topology, args: argparse.Namespace, started: float, tally: Tally) -> None:
    until = started + args.duration_s
    app_at, redis_at = started + 0.4 * args.duration_s, started + 0.65 * args.duration_s
    kills = 0
    traffic = [asyncio.ensure_future(client(topo, tally, until, seed)) for seed in range(args.clients)]
    jobs_task = asyncio.ensure_future(
        submitter(topo, tally, until, args.job_every_s, args.job_lines, (redis_at - 2.0, redis_at))
    )
    next_kill = started + args.worker_kill_every_s
    while time.monotonic() < until:
        now = time.monotonic()
        if app_at and now >= app_at:
            app_at = 0.0
            await asyncio.to_thread(topo.restart_app, 1)
        elif redis_at and now >= redis_at:
            redis_at = 0.0
            await asyncio.to_thread(topo.restart_redis, args.redis_down_s)
        elif now >= next_kill:
            await asyncio.to_thread(topo.restart_worker, kills % 2)
            kills += 1
            next_kill = now + args.worker_kill_every_s
        await asyncio.sleep(0.1)
    await asyncio.gather(*traffic)
    jobs = await jobs_task
    topo.note(f"traffic stopped; waiting for {len(jobs)} jobs")
    await settle(topo, tally, jobs, args.settle_s)


def report(tally: Tally, topo: Topology, args: argparse.Namespace) -> str:
    rows = [
        ("interactive requests sent", tally.sent),
        ("  answered (right labels)", tally.answered),
        ("  lost (no 200 within 60 s)", tally.lost),
        ("  wrong labels", tally.wrong),
        ("  5xx other than 503", tally.unexpected_5xx),
        ("  503 refusals, sent again", tally.refused_503),
        ("  failed connections, sent again", tally.connection_failures),
        ("  p99 latency, answered (ms)", f"{tally.p99_ms():.0f}"),
        ("bulk jobs", tally.jobs),
        ("  items sent", tally.items_sent),
        ("  items answered", tally.items_answered),
        ("  items lost", tally.items_lost),
        ("  items duplicated", tally.items_duplicated),
        ("  job submissions refused, sent again", tally.job_submissions_refused),
    ]
    head = (
        f"chaos run: {args.duration_s:.0f} s, {args.clients} clients, a worker killed every "
        f"{args.worker_kill_every_s:.0f} s, one app replica and "
        + ("a master of the state's Redis Cluster" if args.cluster else "Redis")
        + " killed once"
    )
    body = "\n".join(f"{name:<40} {value}" for name, value in rows)
    samples = "".join(f"\n{sample}" for sample in tally.samples)
    return f"{head}\n{body}{samples}\n\nevents:\n" + "\n".join(topo.events)


def default_model(root: Path) -> str:
    """The example plugin's keyword model: light enough that the run measures the topology."""
    from vllm_sr_example.fixtures import write_fixture

    return str(write_fixture(root / "keywords"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.split("\n")[0])
    parser.add_argument("--duration-s", type=float, default=120.0, help="how long traffic runs")
    parser.add_argument("--model", default=None, help="model to serve (default: the keyword example)")
    parser.add_argument(
        "--clients", type=int, default=8, help="interactive clients, one request each at a time"
    )
    parser.add_argument("--worker-kill-every-s", type=float, default=5.0, help="seconds between worker kills")
    parser.add_argument("--job-every-s", type=float, default=10.0, help="seconds between bulk jobs")
    parser.add_argument("--job-lines", type=int, default=1000, help="requests in each bulk job")
    parser.add_argument("--redis-down-s", type=float, default=2.0, help="how long Redis stays down")
    parser.add_argument("--settle-s", type=float, default=180.0, help="longest wait for the jobs at the end")
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="the state on a Redis Cluster (3 masters, 3 replicas): the Redis fault kills a master",
    )
    parser.add_argument(
        "--faults",
        choices=("processes", "network"),
        default="processes",
        help="kill processes (this module), or make the Redis links misbehave (bench.netchaos)",
    )
    parser.add_argument("--phase-s", type=float, default=30.0, help="network: latency and reset phases")
    parser.add_argument("--blackhole-s", type=float, default=10.0, help="network: each blackhole")
    parser.add_argument("--reset-every-s", type=float, default=3.0, help="network: between resets")
    parser.add_argument("--calm-s", type=float, default=5.0, help="network: healed time between phases")
    args = parser.parse_args(argv)
    if args.faults == "network":
        from bench import netchaos

        return netchaos.main(args)
    with tempfile.TemporaryDirectory(prefix="vllm-srun-chaos-") as root:
        data = Path(root) / "redis-data"
        data.mkdir()
        topo = Topology.start(args.model or default_model(Path(root)), data, cluster=args.cluster)
        tally = Tally()
        try:
            topo.note("topology serving; traffic starts")
            asyncio.run(chaos(topo, args, time.monotonic(), tally))
        finally:
            topo.stop()
    print(report(tally, topo, args))
    failures = tally.failures()
    print(f"\n{'FAIL' if failures else 'ok'}: lost, wrong, duplicated and unexpected 5xx total {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
