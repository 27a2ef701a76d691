"""onnxruntime's quantized graph beside the native engine's dtypes: is it the faster int8 here?

    python -m bench.onnx_int8 [--model minilm|minilm12] [--batch 64] [--tokens 40] [--repeats 7]
                              [--threads 1]

The model's Transformers forward is exported to ONNX (float32, `dynamo=False`) and quantized
with onnxruntime's own `quantize_dynamic`: int8 weights per output channel, activations
quantized per tensor at run time (ORT's dynamic recipe: it has no per-token one). Two graphs:
every MatMul quantized, and the same layers the native int8 keeps out (q/k/v and the FFN
output projection, vllm_srun/engines/native/quantize.py) left in float32. One batch of
`--batch` corpus texts of `--tokens` tokens, mean pooled; each repeat times every variant in
turn and the figure is the median; cosines are against the native float32 embeddings.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.int8_layers import cosines, stacked_minilm
from bench.native_forward import load_native, model_dir, tokenize
from vllm_srun.plugins.base import Batch, WorkItem
from vllm_srun.registry.corpus import corpus

# The exported node names of the linears the native int8 keeps in bfloat16 or float32.
KEPT = ("/query/", "/key/", "/value/", "/output/dense/")


class _Hidden(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def export(model_path: Path, out: Path, sample: torch.Tensor) -> tuple[Path, Path, Path]:
    """float32, all-int8 and selective-int8 ONNX graphs of the model at `model_path`."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from transformers import AutoModel

    dense = out / "float32.onnx"
    axes = {"input_ids": {0: "b", 1: "s"}, "attention_mask": {0: "b", 1: "s"}, "hidden": {0: "b", 1: "s"}}
    torch.onnx.export(
        _Hidden(AutoModel.from_pretrained(str(model_path))).eval(),
        (sample, torch.ones_like(sample)),
        str(dense),
        input_names=["input_ids", "attention_mask"],
        output_names=["hidden"],
        dynamic_axes=axes,
        opset_version=17,
        dynamo=False,
    )
    every, selective = out / "int8-all.onnx", out / "int8-selective.onnx"
    quantize_dynamic(str(dense), str(every), weight_type=QuantType.QInt8, per_channel=True)
    kept = [
        node.name
        for node in onnx.load(str(dense)).graph.node
        if node.op_type == "MatMul" and any(part in node.name for part in KEPT)
    ]
    quantize_dynamic(
        str(dense), str(selective), weight_type=QuantType.QInt8, per_channel=True, nodes_to_exclude=kept
    )
    return dense, every, selective


def session(path: Path, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def pooled(ort_session: Any, feed: dict[str, np.ndarray]) -> Any:
    """A run of `ort_session` on `feed` as the native `encode` is called: mean pooled rows (every
    row is `--tokens` long, so the mean over the sequence is the masked mean)."""
    return lambda _batch: ort_session.run(None, feed)[0].mean(axis=1)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="minilm", choices=("minilm", "minilm12"))
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = [
        r[: args.tokens]
        for r in tokenize(model_dir(), corpus(4 * args.batch, seed=3))
        if len(r) >= args.tokens
    ][: args.batch]
    batch = Batch.from_items([WorkItem(token_ids=r, output="mean") for r in rows])
    ids = np.asarray(rows, dtype=np.int64)
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    with tempfile.TemporaryDirectory() as tmp:
        path = stacked_minilm(Path(tmp) / "m") if args.model == "minilm12" else Path(model_dir())
        graphs = export(path, Path(tmp), torch.from_numpy(ids))
        runs: dict[str, Any] = {d: load_native(path, d).encode for d in ("float32", "bfloat16", "int8")}
        names = ("ort float32", "ort int8 all", "ort int8 selective")
        for name, graph in zip(names, graphs, strict=True):
            runs[name] = pooled(session(graph, args.threads), feed)
        results = {name: np.stack(list(run(batch))).astype(np.float64) for name, run in runs.items()}
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.repeats):
            for name, run in runs.items():
                start = time.perf_counter()
                run(batch)
                times[name].append(time.perf_counter() - start)
    base = statistics.median(times["float32"])
    print(
        f"{args.model}: batch {len(rows)} x {args.tokens} tokens, {args.threads} threads, median of {args.repeats}"
    )
    for name in runs:
        median = statistics.median(times[name])
        worst, mean = cosines(results[name], results["float32"])
        print(
            f"{name:<19} {len(rows) / median:8.1f} texts/s  {base / median:5.2f}x native float32  "
            f"worst cosine {worst:.6f}  mean {mean:.6f}"
        )


if __name__ == "__main__":
    main()
