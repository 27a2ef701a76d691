"""Where a model drifts in bfloat16 from its float32 twin: the twin check's figures on the gate's
corpus and on texts it was never tuned on, and each layer's error on the worst text.

    python -m bench.bf16_drift --model PATH [--rounded] [--held-out-seed 123] [--threads N]

`--rounded` rounds each residual sum to bfloat16 before its LayerNorm, as the engine did before
it kept those sums float32 (engines/native/bert.py `add_norm`), to measure what that costs.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
import torch

from vllm_srun.engines.native import bert, mpnet
from vllm_srun.plugins.discovery import load_plugins
from vllm_srun.registry.approximate import CHECK_TEXTS, _batches, _request, _unit, neighbour_overlap
from vllm_srun.registry.corpus import corpus
from vllm_srun.registry.golden import answer
from vllm_srun.registry.loader import ModelOptions, load_prepared, prepare
from vllm_srun.registry.tables import load_tables

GATE_SEED = 7  # registry/approximate.py's corpus


def rounded_add_norm(norm: torch.nn.LayerNorm, out: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """The sum rounded to the stream's dtype before the LayerNorm."""
    return norm(out.add_(residual))  # type: ignore[no-any-return]


def load(ref: str, dtype: str) -> Any:
    plugins = load_plugins()
    tables = load_tables(e.plugin for e in plugins.of("families").values())
    return load_prepared(prepare(plugins, tables, ModelOptions(ref=ref, dtype=dtype), with_engine=True))


def embed(model: Any, texts: list[str]) -> np.ndarray:
    rows: list[Any] = []
    for batch in _batches(texts):
        rows.extend(item["embedding"] for item in answer(model, "embeddings", _request(batch))["data"])
    return np.asarray(rows, dtype=np.float64)


def figures(ours: np.ndarray, theirs: np.ndarray) -> tuple[np.ndarray, str]:
    cosines = (_unit(ours) * _unit(theirs)).sum(axis=1)
    line = (
        f"min_cosine {cosines.min():.6f} mean_cosine {cosines.mean():.6f} "
        f"neighbour_overlap {neighbour_overlap(ours, theirs):.4f}"
    )
    return cosines, line


def per_layer(reference: Any, model: Any, text: str) -> None:
    """Each block's output on `text` alone (no padding): relative error and worst token cosine.
    Both sides run it through torch's layers: a lone float32 text would otherwise run on the
    small-batch ONNX graph, which no hook sees."""
    outputs: dict[str, list[torch.Tensor]] = {}
    for name, who in (("float32", reference), ("bfloat16", model)):
        captured: list[torch.Tensor] = outputs.setdefault(name, [])
        hooks = [
            block.register_forward_hook(lambda _m, _i, out, c=captured: c.append(out.detach().float()))
            for block in who.engine_model.module.backbone.blocks
        ]
        session, who.engine_model._onnx = who.engine_model._onnx, None
        try:
            answer(who, "embeddings", _request([text]))
        finally:
            who.engine_model._onnx = session
            for hook in hooks:
                hook.remove()
    for i, (a, b) in enumerate(zip(outputs["float32"], outputs["bfloat16"], strict=True)):
        cosine = torch.nn.functional.cosine_similarity(a, b, dim=-1)
        error = float((a - b).norm() / a.norm())
        print(f"  layer {i:2d}: relative error {error:.5f}, worst token cosine {float(cosine.min()):.6f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True, help="an embedder's package directory")
    parser.add_argument("--rounded", action="store_true", help="round residual sums before LayerNorm")
    parser.add_argument("--held-out-seed", type=int, default=123)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.rounded:
        for module in (bert, mpnet):  # mpnet holds its own name for it
            vars(module)["add_norm"] = rounded_add_norm
    reference, model = load(args.model, "float32"), load(args.model, "bfloat16")
    for label, seed in (("gate corpus", GATE_SEED), ("held-out", args.held_out_seed)):
        texts = corpus(CHECK_TEXTS, seed=seed)
        want = embed(reference, texts)
        cosines, line = figures(embed(model, texts), want)
        print(f"{label} (seed {seed}): {line}", flush=True)
        worst = int(np.argmin(cosines))
        print(f"  worst text #{worst} ({len(texts[worst])} chars): {texts[worst][:60]!r}")
        per_layer(reference, model, texts[worst])


if __name__ == "__main__":
    main()
