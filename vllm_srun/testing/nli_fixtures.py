"""Tiny, deterministic NLI cross-encoder packages for the `nli_decisions` family.

`write_fixture(out, variant=...)` writes random weights (safetensors), a config.json whose
`id2label` names the NLI labels, and a real `tokenizer.json`; with `onnx=True` also
`onnx/model.onnx`. The tokenizers, configs and ONNX export are the task_heads fixture
writer's, so both families' fixtures tokenize alike.

This is a development tool: it imports torch and transformers (the family never does).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vllm_srun.testing.task_heads_fixtures import MAX_POSITIONS, SEED, _config, _export_onnx, _model
from vllm_srun.testing.tokenizer_fixtures import bytelevel_tokenizer, unigram_tokenizer, wordpiece_tokenizer

# variant -> (backbone, tokenizer builder, labels in class-index order)
_VARIANTS: dict[str, tuple[str, Any, list[str]]] = {
    # The usual three-way NLI head (the MNLI order of many cross-encoders).
    "bert": ("bert", wordpiece_tokenizer, ["contradiction", "entailment", "neutral"]),
    # Two-way, no neutral, labels capitalised: detection is case-insensitive and neutral optional.
    "modernbert": ("modernbert", bytelevel_tokenizer, ["Entailment", "Contradiction"]),
    # DeBERTa-v3 (the usual NLI cross-encoder today), in the order of its MNLI heads; no type ids.
    "deberta-v3": ("deberta-v3", unigram_tokenizer, ["entailment", "neutral", "contradiction"]),
}
VARIANTS: tuple[str, ...] = tuple(_VARIANTS)


def write_fixture(out: Path, *, variant: str | None = None, onnx: bool = False) -> Path:
    """Write the NLI package `variant` (default "bert") into `out` and return `out`."""
    import torch

    name = variant or "bert"
    if name not in _VARIANTS:
        raise ValueError(f"unknown variant {name!r}; variants: {', '.join(VARIANTS)}")
    backbone, tokenizer, labels = _VARIANTS[name]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok, vocab_size, ids = tokenizer()
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"model_max_length": MAX_POSITIONS}, indent=2))
    torch.manual_seed(SEED)
    model = _model(backbone, "sequence", labels, _config(backbone, vocab_size, ids), multilabel=False)
    model.save_pretrained(str(out), safe_serialization=True)
    if onnx:
        _export_onnx(model, out / "onnx" / "model.onnx", bert=backbone == "bert", hidden=False)
    return out
