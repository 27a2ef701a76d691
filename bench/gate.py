"""The twin check's figures (registry/approximate.py: 256 texts, through the embeddings surface)
of bfloat16 and int8 on all-MiniLM-L6-v2 and on its 12-layer stack.

    python -m bench.gate [--model minilm|minilm12] [--dtypes bfloat16,int8] [--threads N]

"minilm12" is bench/int8_layers.py's stacked model written as a whole package: its weights
beside the packaged MiniLM's tokenizer and sentence-transformers files.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import torch

from bench.int8_layers import stacked_minilm
from bench.native_forward import model_dir
from vllm_srun.plugins.discovery import load_plugins
from vllm_srun.registry.approximate import compare, float32_twin
from vllm_srun.registry.loader import ModelOptions, load_prepared, prepare
from vllm_srun.registry.tables import load_tables


def package(which: str, tmp: Path) -> Path:
    if which == "minilm":
        return model_dir()
    out = tmp / "minilm12"
    shutil.copytree(model_dir(), out, ignore=shutil.ignore_patterns("*.safetensors", "onnx", "*.bin"))
    stacked_minilm(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="minilm", choices=("minilm", "minilm12"))
    parser.add_argument("--dtypes", default="bfloat16,int8")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    plugins = load_plugins()
    tables = load_tables(e.plugin for e in plugins.of("families").values())
    with tempfile.TemporaryDirectory() as tmp:
        ref = str(package(args.model, Path(tmp)))
        for dtype in args.dtypes.split(","):
            prepared = prepare(plugins, tables, ModelOptions(ref=ref, dtype=dtype), with_engine=True)
            result = compare(load_prepared(prepared), float32_twin(prepared), dtype=dtype)
            figures = ", ".join(f"{k} {v:.6f}" for k, v in result.figures.items())
            print(
                f"{args.model} {dtype}: {'passes' if result.passed() else 'REFUSED'} ({figures})", flush=True
            )


if __name__ == "__main__":
    main()
