"""The reference formulas of the sparse and multi-vector outputs, computed straight from
Transformers (eager attention, float32) on one right-padded batch, so the mask is the attention
mask: SPLADE's max over tokens of log(1 + relu(logits)), and FlagEmbedding's BGEM3 lexical
weights and ColBERT vectors from the last hidden states. Shared by
tests/families/task_heads/test_outputs.py and tests/app/test_embedding_outputs.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

ATOL = 1e-5
TEXTS = [
    "good",
    "John Smith lives in Paris and works at Google.",
    "what a terrible movie , i hate it the the movie",  # repeated ids: lexical keeps the max
    "Mary visited London, Berlin and New York City last year with her dog and cat",
]


def batch_of(path: Path, texts: list[str]) -> tuple[Any, Any, Any]:
    """Transformers' tokenizer and model of the package, and its padded batch of `texts`."""
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
    config = transformers.AutoConfig.from_pretrained(str(path))
    cls = getattr(transformers, config.architectures[0])
    model = cls.from_pretrained(str(path), attn_implementation="eager", dtype=torch.float32).eval()
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    if "token_type_ids" in batch and config.model_type == "distilbert":
        del batch["token_type_ids"]
    return tokenizer, model, batch


def splade_reference(path: Path, texts: list[str]) -> list[dict[int, float]]:
    import torch

    _, model, batch = batch_of(path, texts)
    with torch.no_grad():
        logits = model(**batch).logits
    weights = torch.log1p(torch.relu(logits)) * batch["attention_mask"].unsqueeze(-1)
    pooled = weights.max(dim=1).values
    return [{int(i): float(pooled[r, i]) for i in torch.nonzero(pooled[r]).reshape(-1)} for r in range(len(texts))]


def bge_m3_reference(path: Path, texts: list[str]) -> tuple[list[np.ndarray], list[dict[int, float]], list[np.ndarray], list[np.ndarray]]:
    """(dense, lexical weights, ColBERT vectors, token states) as FlagEmbedding's BGEM3 computes
    them from Transformers' last hidden states."""
    import torch

    tokenizer, model, batch = batch_of(path, texts)
    hidden_size = model.config.hidden_size
    sparse = torch.nn.Linear(hidden_size, 1)
    sparse.load_state_dict(torch.load(path / "sparse_linear.pt", weights_only=True))
    state = torch.load(path / "colbert_linear.pt", weights_only=True)
    colbert = torch.nn.Linear(hidden_size, state["weight"].shape[0])
    colbert.load_state_dict(state)
    unused = {tokenizer.convert_tokens_to_ids(tokenizer.special_tokens_map[t]) for t in ("cls_token", "eos_token", "pad_token", "unk_token")}
    mask = batch["attention_mask"]
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
        dense = torch.nn.functional.normalize(hidden[:, 0], dim=-1)
        token_weights = torch.relu(sparse(hidden)).squeeze(-1)
        vecs = colbert(hidden[:, 1:]) * mask[:, 1:][:, :, None].float()
    lexical, multi, tokens = [], [], []
    for r in range(len(texts)):
        count = int(mask[r].sum())
        weights: dict[int, float] = {}
        for w, idx in zip(token_weights[r, :count].tolist(), batch["input_ids"][r, :count].tolist(), strict=True):
            if idx not in unused and w > 0 and w > weights.get(idx, 0.0):
                weights[idx] = w
        lexical.append(weights)
        multi.append(torch.nn.functional.normalize(vecs[r, : count - 1], dim=-1).numpy())
        tokens.append(hidden[r, :count].numpy())
    return [d.numpy() for d in dense], lexical, multi, tokens


def export_graph(path: Path, outputs: tuple[str, ...]) -> Path:
    """Export the package's own Transformers model to `path/onnx/model.onnx`, giving `outputs`,
    each one of "logits" (a *ForMaskedLM's per token), "last_hidden_state" and "pooled_logits"
    (the first token's logits alone: a [batch, vocab] output, as a classifier graph has). The
    legacy exporter from an eval() wrapper that calls the model with keyword arguments, the way
    the fixture writer exports its graphs. Returns `path`."""
    import warnings

    import torch

    from vllm_srun.plugins.architectures import uses_type_ids

    _, model, _ = batch_of(path, ["a"])
    names = ["input_ids", "attention_mask"] + (["token_type_ids"] if uses_type_ids(model.config.to_dict()) else [])

    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *args: Any) -> Any:
            out = self.model(**dict(zip(names, args, strict=True)), output_hidden_states=True)
            values = {
                "logits": getattr(out, "logits", None),
                "last_hidden_state": out.hidden_states[-1],
                "pooled_logits": None if getattr(out, "logits", None) is None else out.logits[:, 0],
            }
            return tuple(values[name] for name in outputs)

    ids = torch.randint(5, 60, (2, 12), dtype=torch.int64)
    args = (ids, torch.ones_like(ids)) + ((torch.zeros_like(ids),) if len(names) == 3 else ())
    dynamic = {name: {0: "batch", 1: "sequence"} for name in (*names, *outputs)}
    if "pooled_logits" in outputs:
        dynamic["pooled_logits"] = {0: "batch"}
    graph = path / "onnx" / "model.onnx"
    graph.parent.mkdir(exist_ok=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's notices
        torch.onnx.export(
            Wrapper().eval(),
            args,
            str(graph),
            input_names=names,
            output_names=list(outputs),
            dynamic_axes=dynamic,
            opset_version=17,
            dynamo=False,
            external_data=False,
        )
    return path
