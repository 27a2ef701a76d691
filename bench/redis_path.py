"""Added latency of the Redis path at concurrency 1, against calling the engine directly.

    python bench/redis_path.py [--requests 300] [--baseline main]

Both sides run the example keyword model on the same distinct inputs (so every server request
is a cache miss) in one run: "direct" plans, runs and finishes in-process; "server" is
`vllm-srun serve` on its embedded Redis, called over HTTP on 127.0.0.1, one request at a time.
`--baseline REF` also serves the code of git REF (a `git archive` of it in a temporary folder),
in the same run, alternating the two servers in rounds so that load from elsewhere on the
machine falls on both alike.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def texts(n: int) -> list[str]:
    # Every text has its own term counts, so none is a cache hit for another.
    return [f"{'refund ' * (1 + i % 17)}{'parcel ' * (1 + i // 17)}please" for i in range(n)]


def direct(package: Path, inputs: list[str]) -> list[float]:
    from vllm_srun.plugins.discovery import load_plugins
    from vllm_srun.plugins.surfaces import ClassifyRequest
    from vllm_srun.registry.loader import ModelOptions, load_model

    model, _ = load_model(load_plugins(), ModelOptions(ref=str(package)), with_engine=True)
    timings = []
    for text in inputs:
        started = time.perf_counter()
        request = ClassifyRequest(input=[text])
        plan = model.plan_surface("classify", request)
        model.finish_surface(plan, model.run(plan.items))
        timings.append(time.perf_counter() - started)
    return timings


def served(package: Path, inputs: list[str], tree: Path | None = None) -> tuple[list[float], list[float]]:
    """(HTTP round trips, Server-Timing totals) of `inputs`, served by `tree`'s code (default:
    this one's)."""
    env = None
    if tree is not None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vllm_srun.cli",
            "serve",
            str(package),
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=tree,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=30) as client:
            for _ in range(200):
                try:
                    if client.get("/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.1)
            for i in range(20):  # warm the connection and the code paths, on texts not measured
                client.post("/v1/classify", json={"input": [f"warm {i} invoice " * (i + 1)]})
            wall, server_total = [], []
            for text in inputs:
                started = time.perf_counter()
                r = client.post("/v1/classify", json={"input": [text]})
                wall.append(time.perf_counter() - started)
                r.raise_for_status()
                total = next(p for p in r.headers["server-timing"].split(", ") if p.startswith("total"))
                server_total.append(float(total.split("=")[1]) / 1000)
        return wall, server_total
    finally:
        proc.terminate()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--baseline", default=None, help="git ref also served, in the same run")
    parser.add_argument("--rounds", type=int, default=3, help="with --baseline: alternations")
    args = parser.parse_args()
    from vllm_sr_example.fixtures import write_fixture

    with tempfile.TemporaryDirectory() as tmp:
        package = write_fixture(Path(tmp) / "kw")
        inputs = texts(args.requests)
        direct_s = direct(package, inputs)
        if args.baseline:
            base = Path(tmp) / "baseline"
            base.mkdir()
            archive = subprocess.run(
                ["git", "-C", str(Path(__file__).resolve().parents[1]), "archive", args.baseline],
                check=True,
                capture_output=True,
            ).stdout
            subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
            runs: dict[str, tuple[list[float], list[float]]] = {"baseline": ([], []), "this tree": ([], [])}
            for _ in range(args.rounds):
                for label, tree in (("baseline", base), ("this tree", None)):
                    wall, total = served(package, inputs, tree)
                    runs[label][0].extend(wall)
                    runs[label][1].extend(total)
            ms = lambda xs: statistics.median(xs) * 1000  # noqa: E731
            print(f"requests: {args.requests} x {args.rounds} rounds each (distinct, all cache misses), concurrency 1")
            print(f"direct in-process (plan+run+finish) p50: {ms(direct_s):.3f} ms")
            for label, (wall, total) in runs.items():
                name = args.baseline if label == "baseline" else label
                print(f"{name:>12}: Server-Timing total p50 {ms(total):.3f} ms, HTTP round trip p50 {ms(wall):.3f} ms")
            return
        wall_s, server_s = served(package, inputs)
    ms = lambda xs: statistics.median(xs) * 1000  # noqa: E731
    print(f"requests: {args.requests} (distinct, all cache misses), concurrency 1")
    print(f"direct in-process (plan+run+finish) p50: {ms(direct_s):.3f} ms")
    print(f"server Server-Timing total         p50: {ms(server_s):.3f} ms")
    print(f"server HTTP round trip (client)    p50: {ms(wall_s):.3f} ms")
    print(f"added by the Redis path (server total - direct): {ms(server_s) - ms(direct_s):.3f} ms")
    print(f"added end to end (HTTP round trip - direct):    {ms(wall_s) - ms(direct_s):.3f} ms")


if __name__ == "__main__":
    main()
