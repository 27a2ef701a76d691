"""Which linears int8 may take: quantize one at a time and measure the embedding's drift.

    python -m bench.int8_layers [--model minilm|base] [--texts 128] [--schemes per_token,per_tensor]
                                [--threads N] [--keep-below 0.9999] [--no-sweep]

For each `nn.Linear` of the native float32 model, that one linear alone is swapped for an
`Int8Linear` (vllm_srun/engines/native/quantize.py) and the mean-pooled embeddings of the bench
corpus are compared with float32's: worst and mean cosine. Then every linear at once, every
linear but those whose own mean cosine fell below `--keep-below`, and the engine's own rule
(`quantize.int8_model`: attention's q/k/v projections in bfloat16, or float32, the rest int8).
`--no-sweep` skips the one-at-a-time rows. "minilm" is the packaged
all-MiniLM-L6-v2; "minilm12" its six layers stacked twice (12 x 384, derived weights); "base" a random-init 12 x 768 BERT (Transformers' own init, std 0.02), fed
MiniLM's token ids of the same texts: random weights have none of a trained model's outlier
dimensions, so "base" is a harsh test of accumulated drift but an honest one only of that.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.native_forward import load_native, model_dir, tokenize
from vllm_srun.engines.native.quantize import Int8Linear, int8_model, linears, replace
from vllm_srun.plugins.base import Batch, WorkItem
from vllm_srun.registry.corpus import corpus

BATCH = 32


def build(which: str, tmp: Path) -> Any:
    from vllm_srun.engines.native import engine

    # The sweep swaps `nn.Linear` modules: float32's stay off oneDNN's packed linear here.
    engine.PACKED_DTYPES = tuple(d for d in engine.PACKED_DTYPES if d != "float32")
    if which == "minilm":
        return load_native(model_dir())
    return load_native(stacked_minilm(tmp) if which == "minilm12" else random_base(tmp))


def stacked_minilm(out: Path) -> Path:
    """A 12 x 384 model with trained weights: all-MiniLM-L6-v2's six layers, then the same six
    again (derived weights: real outlier dimensions, twice the depth for drift to accumulate)."""
    import copy

    from transformers import BertModel

    model = BertModel.from_pretrained(str(model_dir())).eval()
    layers = list(model.encoder.layer)
    model.encoder.layer = torch.nn.ModuleList([*layers, *(copy.deepcopy(layer) for layer in layers)])
    model.config.num_hidden_layers = 12
    model.config.architectures = ["BertModel"]
    model.save_pretrained(str(out), safe_serialization=True)
    return out


def random_base(out: Path) -> Path:
    """A 12 x 768 BERT (MiniLM's vocabulary) with Transformers' random init, seed 0, saved."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        architectures=["BertModel"],
    )
    BertModel(config).eval().save_pretrained(str(out), safe_serialization=True)
    return out


def embed(native: Any, rows: list[list[int]]) -> np.ndarray:
    out = []
    for i in range(0, len(rows), BATCH):
        items = [WorkItem(token_ids=r, output="mean") for r in rows[i : i + BATCH]]
        out.extend(native.encode(Batch.from_items(items), path="packed"))
    return np.stack(out).astype(np.float64)


def cosines(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return float(cos.min()), float(cos.mean())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="minilm", choices=("minilm", "minilm12", "base"))
    parser.add_argument("--texts", type=int, default=128)
    parser.add_argument("--schemes", default="per_token,per_tensor")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--keep-below", type=float, default=0.9999)
    parser.add_argument("--no-sweep", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = [r[:512] for r in tokenize(model_dir(), corpus(args.texts, seed=5))]
    with tempfile.TemporaryDirectory() as tmp:
        native = build(args.model, Path(tmp))
    module = native.module
    reference = embed(native, rows)
    names = [n for n, _ in linears(module)]
    print(
        f"{args.model}: {len(names)} linears, {len(rows)} texts (corpus seed 5), mean-pooled cosine vs float32"
    )
    for scheme in args.schemes.split(","):
        print(f"\n## {scheme}\n\n| linear | worst cosine | mean cosine | 1 - mean |\n|---|---|---|---|")
        sensitive = []
        for name in names if not args.no_sweep else []:
            old = replace(module, name, Int8Linear(module.get_submodule(name), scheme))
            worst, mean = cosines(embed(native, rows), reference)
            replace(module, name, old)
            print(f"| {name} | {worst:.6f} | {mean:.6f} | {1 - mean:.2e} |", flush=True)
            if mean < args.keep_below:
                sensitive.append(name)
        for label, skip in (
            ("all linears", set()),
            (f"all but {len(sensitive)} below {args.keep_below}", set(sensitive)),
        ):
            saved = {
                n: replace(module, n, Int8Linear(module.get_submodule(n), scheme))
                for n in names
                if n not in skip
            }
            worst, mean = cosines(embed(native, rows), reference)
            for n, old in saved.items():
                replace(module, n, old)
            print(f"| **{label}** | {worst:.6f} | {mean:.6f} | {1 - mean:.2e} |")
        for label, bfloat16 in (("engine rule, q/k/v bfloat16", True), ("engine rule, q/k/v float32", False)):
            saved = {n: module.get_submodule(n) for n in names}
            int8_model(module.backbone.blocks, bfloat16=bfloat16, scheme=scheme)
            worst, mean = cosines(embed(native, rows), reference)
            for n, old in saved.items():
                replace(module, n, old)
            print(f"| **{label}** | {worst:.6f} | {mean:.6f} | {1 - mean:.2e} |")
        if not args.no_sweep:
            print(f"\nbelow {args.keep_below} alone: {', '.join(sensitive) or 'none'}")


if __name__ == "__main__":
    main()
