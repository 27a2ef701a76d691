"""Single requests and small batches: which forward path is fastest on all-MiniLM-L6-v2.

    python -m bench.single_forward [--reps 150] [--batches 1,2,4,8] [--threads 1,2] [--no-onnx]

Every path gets the same token ids (tokenizer.json, no padding, no truncation) and returns the
mean-pooled embedding of each row; tokenisation is outside the timed region. Paths:

- native:       the packed native engine as the server runs it (`NativeModel.encode`)
- native-dense: the native engine's small-batch path on torch (rows padded into one block,
                one SDPA call per layer, no gather/scatter)
- native-onnx:  the native engine's small-batch path on onnxruntime (that dense forward
                exported from the loaded module at load)
- native-auto:  the native engine choosing its path by the batch's shape, as the server does
- jit-frozen:   that dense forward traced with `torch.jit.trace` and `torch.jit.freeze`
- jit-optimized: the same, then `torch.jit.optimize_for_inference`
- onnxruntime:  the same model exported with `torch.onnx.export(dynamo=False)`, opset 17, run
                by onnxruntime with all graph optimisations and the same intra-op thread count

Each repetition draws fresh texts from the bench corpus and runs every path once on them, in
turn (A, B, C, D, then B, C, D, A, ...), so drift on a shared machine hits all alike. The table gives the
median milliseconds per batch and, as the noise, the interquartile range; the last column is
the largest |difference| from the packed native output seen on any repetition.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from bench.native_forward import load_native, model_dir, tokenize
from vllm_srun.engines.native.engine import NativeModel
from vllm_srun.plugins.base import Batch, WorkItem
from vllm_srun.registry.corpus import corpus

Path_ = Callable[[list[list[int]]], np.ndarray]


def padded(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    width = max(map(len, rows))
    ids = np.zeros((len(rows), width), dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
        mask[i, : len(row)] = 1
    return ids, mask


def native_path(model: NativeModel, path: str | None) -> Path_:
    def run(rows: list[list[int]]) -> np.ndarray:
        batch = Batch.from_items([WorkItem(token_ids=r, output="mean") for r in rows])
        return np.stack(model.encode(batch, path=path))

    return run


def jit_path(model: NativeModel, *, optimize: bool = False) -> Path_:
    """The dense forward traced per mask kind (one row needs no mask) and frozen; `optimize`
    adds `torch.jit.optimize_for_inference` (oneDNN fusions where it finds them)."""
    from vllm_srun.engines.native.attention import Block

    encoder = model.module

    def dense(ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        rows, width = ids.shape
        block = Block.traced(torch.ones_like(ids) if mask is None else (mask[:, 0, 0, :] == 0).long())
        return encoder(ids.reshape(-1), None, block).view(rows, width, -1)

    class Unmasked(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = encoder

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return dense(ids, None)

    class Masked(Unmasked):
        def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            return dense(ids, mask)

    with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        example = torch.randint(1000, 2000, (2, 17))
        emask = torch.zeros(2, 1, 1, 17)
        one = torch.jit.freeze(torch.jit.trace(Unmasked().eval(), (example[:1],), check_trace=False))
        many = torch.jit.freeze(torch.jit.trace(Masked().eval(), (example, emask), check_trace=False))
        if optimize:
            one, many = torch.jit.optimize_for_inference(one), torch.jit.optimize_for_inference(many)

    def run(rows: list[list[int]]) -> np.ndarray:
        ids, mask = padded(rows)
        with torch.no_grad():
            if len(rows) == 1:
                hidden = one(torch.as_tensor(ids))
            else:
                valid = torch.as_tensor(mask, dtype=torch.bool)
                additive = torch.zeros(valid.shape).masked_fill(~valid, float("-inf"))[:, None, None, :]
                hidden = many(torch.as_tensor(ids), additive)
        weights = torch.as_tensor(mask, dtype=torch.float32)[..., None]
        return ((hidden * weights).sum(1) / weights.sum(1)).numpy()

    return run


def export_onnx(path: Path, out: Path) -> Path:
    from transformers import AutoModel

    model = AutoModel.from_pretrained(path, attn_implementation="eager").eval()

    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    ids = torch.randint(1000, 2000, (2, 12))
    target = out / "model.onnx"
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Wrapper().eval(),
            (ids, torch.ones_like(ids)),
            str(target),
            input_names=["input_ids", "attention_mask"],
            output_names=["last_hidden_state"],
            dynamic_axes={
                "input_ids": {0: "batch", 1: "sequence"},
                "attention_mask": {0: "batch", 1: "sequence"},
                "last_hidden_state": {0: "batch", 1: "sequence"},
            },
            opset_version=17,
            dynamo=False,
            external_data=False,
        )
    return target


def onnx_path(graph: Path, threads: int) -> Path_:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # As the engine's session: a spinning pool would steal the core from the next path timed.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])

    def run(rows: list[list[int]]) -> np.ndarray:
        ids, mask = padded(rows)
        (hidden,) = session.run(["last_hidden_state"], {"input_ids": ids, "attention_mask": mask})
        weights = mask[..., None].astype(np.float32)
        return np.asarray((hidden * weights).sum(1) / weights.sum(1), dtype=np.float32)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=150)
    parser.add_argument("--batches", default="1,2,4,8")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--no-onnx", action="store_true")
    parser.add_argument("--no-jit", action="store_true")
    args = parser.parse_args()

    path = model_dir()
    sizes = [int(b) for b in args.batches.split(",")]
    rows = tokenize(path, corpus(args.reps * max(sizes) + 64, seed=7))
    tmp = tempfile.TemporaryDirectory()
    graph = None if args.no_onnx else export_onnx(path, Path(tmp.name))

    tokens = sum(map(len, rows)) / len(rows)
    print(f"all-MiniLM-L6-v2, bench corpus ({tokens:.0f} tokens per text on average), {args.reps} reps")
    print(f"{'threads':>7} {'batch':>5} {'path':<14} {'p50 ms':>8} {'IQR ms':>13} {'max|d|':>8}")
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        # A fresh model per thread count, as a server started with that count has (the
        # engine's onnxruntime session would follow torch's count anyway, opening a new one).
        model = load_native(path)
        paths: dict[str, Path_] = {
            "native": native_path(model, "packed"),
            "native-dense": native_path(model, "dense"),
            "native-onnx": native_path(model, "onnx"),
            "native-auto": native_path(model, None),
        }
        if not args.no_jit:
            paths["jit-frozen"] = jit_path(model)
            paths["jit-optimized"] = jit_path(model, optimize=True)
        if graph is not None:
            paths["onnxruntime"] = onnx_path(graph, threads)
        for size in sizes:
            times: dict[str, list[float]] = {name: [] for name in paths}
            diff = dict.fromkeys(paths, 0.0)
            for warm in range(10):
                for run in paths.values():
                    run(rows[warm * size : (warm + 1) * size])
            for rep in range(args.reps):
                chunk = rows[64 + rep * size : 64 + (rep + 1) * size]
                ref = paths["native"](chunk)  # untimed: the reference for max|d|
                names = list(paths)
                names = names[rep % len(names) :] + names[: rep % len(names)]  # no fixed first place
                for name in names:
                    run = paths[name]
                    start = time.perf_counter()
                    out = run(chunk)
                    times[name].append((time.perf_counter() - start) * 1e3)
                    diff[name] = max(diff[name], float(np.abs(out - ref).max()))
            for name, values in times.items():
                q = statistics.quantiles(values, n=4)
                print(
                    f"{threads:>7} {size:>5} {name:<14} {statistics.median(values):8.2f} "
                    f"{q[0]:6.2f}-{q[2]:6.2f} {diff[name]:8.1e}"
                )


if __name__ == "__main__":
    main()
