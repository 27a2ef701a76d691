"""What one Redis core carries: Redis commands and Redis CPU per item, interactive and bulk.

    python -m bench.redis_capacity [--seconds 10] [--job-items 5000] [--baseline main]
                                   [--redis-url redis://host:port]

A Redis server, two app replicas (`serve --redis`) and two device workers run the example
keyword model, whose forward costs next to nothing, so the Redis path is what is measured.
Interactive: `--clients` concurrent clients send classify requests of `--inputs` distinct texts
each (every item a cache miss) for `--seconds`. Bulk: one classify job of `--job-items` distinct
lines, from submission to `completed`. For each, Redis's own counters are reset before and read
after (`CONFIG RESETSTAT`, `INFO commandstats`, `used_cpu_sys` + `used_cpu_user`): commands per
item, Redis CPU microseconds per item, and hence items per second one Redis core could carry
(1e6 / CPU us per item), and Redis's I/O events per item (`total_reads_processed` +
`total_writes_processed`: a request or pipeline read, a reply or pub/sub message written). The
client's own items/s is reported too, but on a small machine the
apps and workers, not Redis, bound it.

`--baseline REF` runs the same measurement first on the code of git REF (extracted with
`git archive` into a temporary folder; nothing in the repository changes), then on this tree,
in one run, and prints both. `--redis-url` measures against a Redis already running instead of
starting one (its data is flushed and its counters reset); a cluster node's URL measures the
whole cluster, its counters summed over every node (masters and replicas).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import redis

from bench.procs import HOST, Proc, free_port
from vllm_srun.cli.embedded_redis import find_redis_server

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Profile:
    """What Redis did for `items` items in `wall_s`."""

    path: str
    items: int
    wall_s: float
    commands: int
    cpu_s: float
    top: list[tuple[str, int, int]]
    # Read events Redis handled (a client's request or pipeline arriving: a round trip), and
    # write events (a reply, or pub/sub messages, going out).
    reads: int = 0
    writes: int = 0

    @property
    def commands_per_item(self) -> float:
        return self.commands / max(self.items, 1)

    @property
    def cpu_us_per_item(self) -> float:
        return self.cpu_s * 1e6 / max(self.items, 1)

    @property
    def items_per_core_s(self) -> float:
        return 1e6 / self.cpu_us_per_item if self.cpu_us_per_item else float("inf")


class Servers:
    """The Redis servers behind a URL: the one it names, or every node of the cluster it names
    (masters and replicas: a replica's CPU applying the writes is the cluster's cost too)."""

    def __init__(self, url: str) -> None:
        from vllm_srun.queue.redis import cluster_nodes

        nodes = cluster_nodes(url)
        if nodes:
            self.clients = [redis.Redis(host=host, port=port) for host, port in nodes]
        else:
            self.clients = [redis.Redis.from_url(url)]

    def flush(self) -> None:
        for client in self.clients:
            if client.info("replication")["role"] == "master":
                client.flushall()

    def config_resetstat(self) -> None:
        for client in self.clients:
            client.config_resetstat()

    def close(self) -> None:
        for client in self.clients:
            client.close()


def _reset(servers: Servers) -> float:
    servers.config_resetstat()
    return _cpu(servers)


def _cpu(servers: Servers) -> float:
    total = 0.0
    for client in servers.clients:
        info = client.info("cpu")
        total += float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
    return total


def _commands(servers: Servers) -> list[tuple[str, int, int]]:
    """(command, calls, microseconds inside it) as Redis counted them, summed over the servers;
    a script's own commands are counted too, and inside its EVALSHA's time."""
    calls: dict[str, list[int]] = {}
    for client in servers.clients:
        for name, v in client.info("commandstats").items():
            entry = calls.setdefault(name.removeprefix("cmdstat_"), [0, 0])
            entry[0] += int(v["calls"])
            entry[1] += int(v["usec"])
    # Our own INFO / CONFIG reads are not the runtime's; nor a cluster's own gossip.
    ours = [(n, c, u) for n, (c, u) in calls.items() if n not in ("info", "config", "cluster", "ping")]
    return sorted(ours, key=lambda x: -x[1])


def _profile(client: Servers, path: str, items: int, wall_s: float, cpu_start: float) -> Profile:
    calls = _commands(client)
    cpu_s = _cpu(client) - cpu_start
    stats = [c.info("stats") for c in client.clients]
    reads = sum(int(s.get("total_reads_processed", 0)) for s in stats)
    writes = sum(int(s.get("total_writes_processed", 0)) for s in stats)
    return Profile(path, items, wall_s, sum(c for _, c, _ in calls), cpu_s, calls[:10], reads, writes)


_WORDS = ("refund", "invoice", "charge", "parcel", "delivery")


def _text(run: int, i: int) -> str:
    """A text whose token ids no other (run, i) has: the keyword model's ids are its known words
    in order, so the digits of (run, i) in base 5, written as its five words, are distinct."""
    n, words = run * 10**8 + i, []
    while n:
        n, digit = divmod(n, 5)
        words.append(_WORDS[digit])
    return " ".join(words)


async def interactive(urls: list[str], clients: int, inputs: int, seconds: float, run: int) -> int:
    """Items answered by `clients` concurrent clients over `seconds` (each request `inputs` texts)."""
    stop = time.monotonic() + seconds
    counter = iter(range(10**9))
    done = 0

    async def one(index: int) -> None:
        nonlocal done
        async with httpx.AsyncClient(base_url=urls[index % len(urls)], timeout=30) as http:
            while time.monotonic() < stop:
                texts = [_text(run, next(counter)) for _ in range(inputs)]
                r = await http.post("/v1/classify", json={"input": texts})
                r.raise_for_status()
                done += inputs

    await asyncio.gather(*(one(i) for i in range(clients)))
    return done


def bulk(url: str, items: int, run: int, timeout_s: float = 600.0) -> float:
    """Seconds from submitting a job of `items` lines to its completion."""
    body = "\n".join(json.dumps({"input": _text(run, i)}) for i in range(items))
    started = time.monotonic()
    r = httpx.post(
        f"{url}/v1/jobs?surface=classify",
        content=body,
        headers={"content-type": "application/x-ndjson"},
        timeout=120,
    )
    r.raise_for_status()
    job = r.json()["id"]
    while time.monotonic() - started < timeout_s:
        status = httpx.get(f"{url}/v1/jobs/{job}", timeout=30).json()
        if status["status"] in ("completed", "failed", "cancelled"):
            assert status["status"] == "completed", status
            return time.monotonic() - started
        time.sleep(0.05)
    raise RuntimeError(f"job {job} not done in {timeout_s} s")


def _serve(tree: Path, package: Path, redis_url: str, name: str) -> tuple[Proc, str]:
    port = free_port()
    args = [sys.executable, "-m", "vllm_srun.cli", "serve", str(package), "--redis", redis_url]
    args += ["--port", str(port), "--log-level", "warning"]
    return Proc(args, name, env=_env(tree), cwd=tree), f"http://{HOST}:{port}"


def _worker(tree: Path, package: Path, redis_url: str, name: str) -> Proc:
    args = [sys.executable, "-m", "vllm_srun.cli", "worker", str(package), "--redis", redis_url]
    return Proc([*args, "--log-level", "warning"], name, env=_env(tree), cwd=tree)


def _env(tree: Path) -> dict[str, str]:
    # Run from `tree` (`python -m` puts the working directory first on the path), with it on
    # PYTHONPATH too: that tree's vllm_srun, ahead of any installed one. The bench module itself
    # and the example plugin are this run's.
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))}


def _wait_ready(url: str, proc: Proc, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"exited:\n{proc.log_tail()}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"not ready in {timeout_s} s:\n{proc.log_tail()}")


def measure(tree: Path, package: Path, redis_url: str, args: argparse.Namespace, run: int) -> list[Profile]:
    """Both paths, with apps and workers running `tree`'s code, against `redis_url`."""
    imported = subprocess.run(
        [sys.executable, "-c", "import vllm_srun; print(vllm_srun.__file__)"],
        env=_env(tree),
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(imported).resolve().is_relative_to(tree.resolve()), f"{tree} runs {imported}"
    client = Servers(redis_url)
    client.flush()
    procs: list[Proc] = []
    try:
        apps = [_serve(tree, package, redis_url, f"cap-app{i}") for i in range(args.apps)]
        procs += [p for p, _ in apps] + [_worker(tree, package, redis_url, f"cap-w{i}") for i in range(args.workers)]
        for proc, url in apps:
            _wait_ready(url, proc)
        urls = [url for _, url in apps]
        asyncio.run(interactive(urls, 4, args.inputs, 1.0, 3 * run + 1))  # warm code paths
        cpu = _reset(client)
        started = time.monotonic()
        items = asyncio.run(interactive(urls, args.clients, args.inputs, args.seconds, 3 * run + 2))
        profiles = [_profile(client, "interactive", items, time.monotonic() - started, cpu)]
        cpu = _reset(client)
        wall_s = bulk(urls[0], args.job_items, 3 * run + 3)
        profiles.append(_profile(client, "bulk job", args.job_items, wall_s, cpu))
        return profiles
    finally:
        for proc in procs:
            proc.stop()
        client.close()


def _extract(ref: str, into: Path) -> Path:
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def table(rows: list[tuple[str, Profile]]) -> str:
    """One row per tree and path: the items of all rounds, and the median round's CPU per item
    (the rounds' range beside it)."""
    head = (
        "| code | path | items | items/s (client) | Redis cmds/item | Redis I/O events/item "
        "| Redis CPU us/item (range) | items/s per Redis core |"
    )
    lines = [head, "|" + "---|" * 8]
    groups: dict[tuple[str, str], list[Profile]] = {}
    for label, p in rows:
        groups.setdefault((label, p.path), []).append(p)
    for (label, path), runs in groups.items():
        cpu = sorted(p.cpu_us_per_item for p in runs)
        median = cpu[len(cpu) // 2] if len(cpu) % 2 else (cpu[len(cpu) // 2 - 1] + cpu[len(cpu) // 2]) / 2
        items = sum(p.items for p in runs)
        rate = items / sum(p.wall_s for p in runs)
        commands = sum(p.commands for p in runs) / items
        events = sum(p.reads + p.writes for p in runs) / items
        lines.append(
            f"| {label} | {path} | {items} | {rate:.0f} | {commands:.2f} | {events:.2f} "
            f"| {median:.1f} ({cpu[0]:.1f}-{cpu[-1]:.1f}) | {1e6 / median:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0, help="interactive traffic per run")
    parser.add_argument("--clients", type=int, default=16, help="concurrent interactive clients")
    parser.add_argument("--inputs", type=int, default=4, help="texts per interactive request")
    parser.add_argument("--job-items", type=int, default=5000, help="lines of the bulk job")
    parser.add_argument("--apps", type=int, default=2, help="app replicas")
    parser.add_argument("--workers", type=int, default=2, help="device workers")
    parser.add_argument("--baseline", default=None, help="git ref measured first, in the same run")
    parser.add_argument("--rounds", type=int, default=1, help="measurements of each tree, alternated")
    parser.add_argument("--redis-url", default=None, help="an existing Redis to measure (default: start one)")
    args = parser.parse_args(argv)
    from vllm_sr_example.fixtures import write_fixture

    with tempfile.TemporaryDirectory(prefix="bench-capacity-") as tmp:
        package = write_fixture(Path(tmp) / "kw")
        server: Proc | None = None
        redis_url = args.redis_url
        if redis_url is None:
            port = free_port()
            server = Proc([find_redis_server(), "--port", str(port), "--bind", HOST, "--save", ""], "cap-redis")
            redis_url = f"redis://{HOST}:{port}/0"
            deadline = time.monotonic() + 10
            while "Ready to accept connections" not in server.log_tail(100000):
                if time.monotonic() > deadline or not server.alive():
                    raise RuntimeError(server.log_tail())
                time.sleep(0.05)
        try:
            trees: list[tuple[str, Path]] = []
            if args.baseline:
                trees.append((args.baseline, _extract(args.baseline, Path(tempfile.mkdtemp(dir=tmp)))))
            trees.append(("this tree", REPO))
            rows = []
            # Rounds alternate the trees, so load from elsewhere on the machine falls on both.
            for round_ in range(args.rounds):
                for index, (label, tree) in enumerate(trees):
                    for profile in measure(tree, package, redis_url, args, round_ * len(trees) + index):
                        rows.append((label, profile))
                        print(
                            f"{label} {profile.path}: {profile.reads / profile.items:.2f} reads and "
                            f"{profile.writes / profile.items:.2f} writes per item; top commands {profile.top}",
                            file=sys.stderr,
                        )
        finally:
            if server is not None:
                server.stop()
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
