"""Tiny, deterministic model packages for the `task_heads` family (tests and `vllm-srun fixture`).

`write_fixture(out, variant=...)` writes a package the family loads like a real one (config,
random safetensors weights, a real tokenizer.json, sentence-transformers files for embedders;
`onnx=True` adds onnx/model.onnx). With `weights=False` it needs no torch and holds no tensors:
it detects, verifies, loads and plans, but cannot run. Imports transformers and torch.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from vllm_srun.testing.tokenizer_fixtures import TOKENIZERS

LABELS = {
    "sequence": ["negative", "neutral", "positive"],
    "multilabel": ["toxic", "insult", "threat", "spam"],
    "token": ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"],
    "reranker": ["LABEL_0"],
    "binary": ["negative", "positive"],
    "language": ["en", "de", "fr", "other"],
}

HEADS = {
    "sequence": "sequence",
    "multilabel": "sequence",
    "token": "token",
    "embedding": "model",
    "reranker": "sequence",
}
# The extra variants' heads (see `_variants`): not generated per row from HEADS.
_EXTRA_HEADS = {"splade": "masked_lm", "bge-m3": "model"}
# bge-m3's ColBERT width differs from its hidden size here (FlagEmbedding's colbert_dim), so a
# reader that assumed the hidden size would fail.
COLBERT_DIM = 24
# Labels and pooling of the variants whose defaults do not fit (the defaults: a variant's head
# name is its labels key; embedders pool by mean).
_LABELS_OF = {"modernbert-sequence": "binary", "mmbert-sequence": "language"}
_POOLING_OF = {
    "modernbert-embedding": "cls",
    "gte-embedding": "cls",  # as gte-*-v1.5 ship
    "qwen3-embedding": "last",  # as Qwen3-Embedding ships
}


def _variants() -> dict[str, tuple[str, str, str | None, str | None]]:
    """variant -> (flavour, head, labels key, pooling): `<flavour>-<head>` for every fixture
    flavour of every row of the architecture table."""
    from vllm_srun.plugins.architectures import architectures

    out: dict[str, tuple[str, str, str | None, str | None]] = {}
    for arch in architectures():
        kinds = {kind for kind, _ in arch.classes.values()}
        for flavour in arch.fixtures:
            for head, kind in HEADS.items():
                if kind not in kinds:
                    continue
                variant = f"{flavour}-{head}"
                labels = None if head == "embedding" else _LABELS_OF.get(variant, head)
                pooling = _POOLING_OF.get(variant, "mean") if head == "embedding" else None
                out[variant] = (flavour, head, labels, pooling)
    return out


def _output_variants() -> dict[str, tuple[str, str, str | None, str | None]]:
    """Sparse and multi-vector packages, as `_variants`: `<flavour>-splade` (a *ForMaskedLM)
    where the row reads one as SPLADE, and `xlm-roberta-bge-m3` (an XLM-RoBERTa embedder with
    bge-m3's two extra heads)."""
    from vllm_srun.plugins.architectures import architectures

    out: dict[str, tuple[str, str, str | None, str | None]] = {}
    for arch in architectures():
        for flavour in arch.fixtures:
            if arch.sparse_head is not None:
                out[f"{flavour}-splade"] = (flavour, "splade", None, None)
            if flavour == "xlm-roberta":
                out[f"{flavour}-bge-m3"] = (flavour, "bge-m3", None, "cls")
    return out


def fixture_of(flavour: str) -> tuple[Any, Any]:
    """(table row, Fixture) of a fixture flavour ("bert", "xlm-roberta", ...)."""
    from vllm_srun.plugins.architectures import architectures

    for arch in architectures():
        if flavour in arch.fixtures:
            return arch, arch.fixtures[flavour]
    raise ValueError(f"no architecture has a fixture flavour {flavour!r}")


_VARIANTS = _variants()
VARIANTS: tuple[str, ...] = tuple(_VARIANTS)
OUTPUT_VARIANTS: tuple[str, ...] = tuple(_output_variants())

MAX_POSITIONS = 128
SEED = 1234
# The tiny sizes every fixture shares; a Fixture's settings add to or override them.
TINY = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "initializer_range": 0.2,
}
_SPECIAL_KEYS = {"pad": "pad_token_id", "bos": "bos_token_id", "eos": "eos_token_id", "cls": "cls_token_id", "sep": "sep_token_id"}
# Which tokenizer id each config key takes (bos/cls are the tokenizer's first special, eos/sep its last).
_SPECIAL_SOURCE = {"pad": "pad", "bos": "cls", "eos": "sep", "cls": "cls", "sep": "sep"}


def _config(flavour: str, vocab_size: int, ids: dict[str, int]) -> Any:
    import transformers

    arch, fixture = fixture_of(flavour)
    settings: dict[str, Any] = dict(TINY, vocab_size=vocab_size)
    for name in fixture.special_ids:
        settings[_SPECIAL_KEYS[name]] = ids[_SPECIAL_SOURCE[name]]
    settings["max_position_embeddings"] = MAX_POSITIONS + (
        settings.get("pad_token_id", 0) + 1 if arch.position_offset else 0
    )
    if arch.uses_type_ids({"type_vocab_size": 2}):
        settings["type_vocab_size"] = 2
    settings.update(fixture.settings)
    return getattr(transformers, fixture.config_class)(**settings)


def _name_head(flavour: str, head: str, labels: list[str] | None, config: Any, multilabel: bool) -> str:
    """Write the head into `config` (labels, problem type, architecture); return the class name."""
    _, fixture = fixture_of(flavour)
    if labels is not None:
        config.id2label = dict(enumerate(labels))
        config.label2id = {label: i for i, label in enumerate(labels)}
        config.num_labels = len(labels)
    if multilabel:
        config.problem_type = "multi_label_classification"
    suffix = {
        "sequence": "ForSequenceClassification",
        "token": "ForTokenClassification",
        "masked_lm": "ForMaskedLM",
    }.get(head, "Model")
    config.architectures = [fixture.class_prefix + suffix]
    return fixture.class_prefix + suffix


def _model(flavour: str, head: str, labels: list[str] | None, config: Any, multilabel: bool) -> Any:
    """The Transformers model of that head, with random weights from torch's current seed."""
    import transformers

    architecture = _name_head(flavour, head, labels, config, multilabel)
    model = getattr(transformers, architecture)(config)
    model.eval()
    return model


def _write_empty_safetensors(path: Path) -> None:
    """A valid safetensors file with no tensors: an 8-byte little-endian header length, then the
    JSON header, padded to a multiple of 8 as the format's reference writer does."""
    header = json.dumps({"__metadata__": {"format": "pt"}}).encode()
    header += b" " * (-len(header) % 8)
    path.write_bytes(len(header).to_bytes(8, "little") + header)


def _export_onnx(model: Any, path: Path, *, bert: bool, hidden: bool) -> None:
    """Export `model`'s logits (or last hidden state) to `path`; `bert`: it takes token type ids."""
    import torch

    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *args: Any) -> Any:
            names = ["input_ids", "attention_mask", "token_type_ids"][: len(args)]
            out = self.model(**dict(zip(names, args, strict=True)))
            return out.last_hidden_state if hidden else out.logits

    # Eager attention traces to plain MatMul/Softmax ops with no data-dependent branches.
    model.set_attn_implementation("eager")
    wrapper = Wrapper().eval()
    names = ["input_ids", "attention_mask"] + (["token_type_ids"] if bert else [])
    seq = 12
    ids = torch.randint(5, 60, (2, seq), dtype=torch.int64)
    args = (ids, torch.ones_like(ids)) + ((torch.zeros_like(ids),) if bert else ())
    output = "last_hidden_state" if hidden else "logits"
    dynamic = {name: {0: "batch", 1: "sequence"} for name in names}
    dynamic[output] = (
        {0: "batch"}
        if model.config.architectures[0].endswith("SequenceClassification")
        else {0: "batch", 1: "sequence"}
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad(), warnings.catch_warnings():
        # The legacy exporter is chosen on purpose (one self-contained file); its notices are noise.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            wrapper,
            args,
            str(path),
            input_names=names,
            output_names=[output],
            dynamic_axes=dynamic,
            opset_version=17,
            dynamo=False,
            external_data=False,
        )


def write_fixture(out: Path, *, variant: str, onnx: bool = False, weights: bool = True) -> Path:
    """Write the package `variant` (one of `VARIANTS`) into `out` and return `out`.

    `weights=False` needs no torch and writes a weights file without tensors (see above)."""
    variants = _variants() | _output_variants()  # rows a plugin registered since import count too
    if variant not in variants:
        raise ValueError(f"unknown variant {variant!r}; variants: {', '.join(variants)}")
    if onnx and not weights:
        raise ValueError("an ONNX graph is exported from the weights: onnx=True needs weights=True")
    flavour, head_name, labels_key, pooling = variants[variant]
    arch, fixture = fixture_of(flavour)
    head = HEADS.get(head_name) or _EXTRA_HEADS[head_name]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok, vocab_size, ids = TOKENIZERS[fixture.tokenizer]()
    tok.save(str(out / "tokenizer.json"))
    tokenizer_config: dict[str, Any] = {"model_max_length": MAX_POSITIONS}
    if fixture.tokenizer == "wordpiece":
        # Say what tokenizer.json is: without it AutoTokenizer (sentence-transformers' loader)
        # picks the model type's own class, and MPNet's adds <s>, </s>, <pad> and <mask> as
        # new ids past the vocabulary.
        tokenizer_config["tokenizer_class"] = "BertTokenizer"
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))

    config = _config(flavour, vocab_size, ids)
    labels = LABELS[labels_key] if labels_key else None
    multilabel = labels_key == "multilabel"
    model = None
    if weights:
        import torch

        torch.manual_seed(SEED)
        model = _model(flavour, head, labels, config, multilabel=multilabel)
        model.save_pretrained(str(out), safe_serialization=True)
    else:
        _name_head(flavour, head, labels, config, multilabel=multilabel)
        config.save_pretrained(str(out))
        _write_empty_safetensors(out / "model.safetensors")
    if fixture.hub_config:
        # Keys as Hub configs spell them (Transformers rewrites some on load; keep both forms).
        data = json.loads((out / "config.json").read_text())
        data.update(fixture.hub_config)
        (out / "config.json").write_text(json.dumps(data, indent=2, sort_keys=True))
    if pooling is not None:
        modules = [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
        ]
        (out / "modules.json").write_text(json.dumps(modules, indent=2))
        (out / "1_Pooling").mkdir(exist_ok=True)
        pool = {
            "word_embedding_dimension": config.hidden_size,
            "pooling_mode_cls_token": pooling == "cls",
            "pooling_mode_mean_tokens": pooling == "mean",
            "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False,
            "pooling_mode_lasttoken": pooling == "last",
        }
        (out / "1_Pooling" / "config.json").write_text(json.dumps(pool, indent=2))
    if head_name == "bge-m3":
        _add_bge_m3_heads(out, config.hidden_size, weights=weights)
    if model is not None and onnx:
        types = arch.uses_type_ids(config.to_dict())
        _export_onnx(model, out / "onnx" / "model.onnx", bert=types, hidden=head == "model")
    return out


def _add_bge_m3_heads(out: Path, hidden: int, *, weights: bool) -> None:
    """bge-m3's `sparse_linear.pt` (Linear(hidden, 1)) and `colbert_linear.pt`
    (Linear(hidden, COLBERT_DIM)) as FlagEmbedding saves them: torch.save of a state dict; and
    the special tokens its tokenizer_config.json names (lexical weights leave them out)."""
    config_path = out / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text())
    tokenizer_config.update(
        tokenizer_class="PreTrainedTokenizerFast",
        bos_token="<bos>",
        cls_token="<bos>",
        eos_token="<eos>",
        sep_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
    )
    config_path.write_text(json.dumps(tokenizer_config, indent=2))
    if not weights:
        return
    import torch

    torch.manual_seed(SEED + 1)
    sparse = torch.nn.Linear(hidden, 1)
    # Wide weights and no bias, so that about half the tokens weigh more than 0 (the default
    # init leaves the weights of a random encoder's similar token states all on one side).
    torch.nn.init.normal_(sparse.weight, std=1.0)
    torch.nn.init.zeros_(sparse.bias)
    torch.save(sparse.state_dict(), out / "sparse_linear.pt")
    torch.save(torch.nn.Linear(hidden, COLBERT_DIM).state_dict(), out / "colbert_linear.pt")


def add_sentence_transformers(
    out: Path,
    *,
    prompts: dict[str, str] | None = None,
    default_prompt_name: str | None = None,
    include_prompt: bool = True,
    dense_features: int | None = None,
    dense_activation: str = "torch.nn.modules.activation.Tanh",
    max_seq_length: int | None = None,
    do_lower_case: bool | None = None,
    similarity_fn_name: str | None = None,
) -> Path:
    """Give the sentence-transformers embedder package in `out` (a fixture or a copy of a real
    one) prompts, a Pooling that leaves prompts out, a Dense module before its Normalize (random
    weights, seeded, written with numpy), or sentence_bert_config.json settings, the way
    sentence-transformers saves them. Returns `out`."""
    import numpy as np
    from safetensors.numpy import save_file

    out = Path(out)
    modules = json.loads((out / "modules.json").read_text())
    pooling = next(m for m in modules if m["type"].endswith("Pooling"))
    pool_path = out / (pooling.get("path") or "1_Pooling") / "config.json"
    if not include_prompt:
        pool = json.loads(pool_path.read_text())
        pool["include_prompt"] = False
        pool_path.write_text(json.dumps(pool, indent=2))
    if prompts is not None or similarity_fn_name is not None:
        st_path = out / "config_sentence_transformers.json"
        st = json.loads(st_path.read_text()) if st_path.exists() else {}
        if prompts is not None:
            st.update(prompts=prompts, default_prompt_name=default_prompt_name)
        if similarity_fn_name is not None:
            st["similarity_fn_name"] = similarity_fn_name
        st_path.write_text(json.dumps(st, indent=2))
    if max_seq_length is not None or do_lower_case is not None:
        sb_path = out / "sentence_bert_config.json"
        sb = json.loads(sb_path.read_text()) if sb_path.exists() else {}
        if max_seq_length is not None:
            sb["max_seq_length"] = max_seq_length
        if do_lower_case is not None:
            sb["do_lower_case"] = do_lower_case
        sb_path.write_text(json.dumps(sb, indent=2))
    if dense_features is not None:
        hidden = int(json.loads((out / "config.json").read_text())["hidden_size"])
        rng = np.random.default_rng(SEED)
        dense_dir = out / "2_Dense"
        dense_dir.mkdir(exist_ok=True)
        config = {
            "in_features": hidden,
            "out_features": dense_features,
            "bias": True,
            "activation_function": dense_activation,
        }
        (dense_dir / "config.json").write_text(json.dumps(config, indent=2))
        bound = 1.0 / np.sqrt(hidden)
        tensors = {
            "linear.weight": rng.uniform(-bound, bound, (dense_features, hidden)).astype(np.float32),
            "linear.bias": rng.uniform(-bound, bound, (dense_features,)).astype(np.float32),
        }
        save_file(tensors, str(dense_dir / "model.safetensors"))
        at = modules.index(pooling) + 1
        modules.insert(
            at, {"idx": at, "name": str(at), "path": "2_Dense", "type": "sentence_transformers.models.Dense"}
        )
        for i, module in enumerate(modules):
            module["idx"], module["name"] = i, str(i)
        (out / "modules.json").write_text(json.dumps(modules, indent=2))
    return out


def add_sparse_encoder(out: Path, *, max_seq_length: int | None = None, pooling_strategy: str = "max") -> Path:
    """Give the SPLADE package in `out` (a `*-splade` fixture) the modules a sentence-transformers
    SparseEncoder saves, as Hub packages spell them (naver/splade_v2_max): an MLMTransformer and
    a SpladePooling, `sentence_bert_config.json` and `config_sentence_transformers.json`.
    Returns `out`."""
    out = Path(out)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.sparse_encoder.models.MLMTransformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_SpladePooling",
            "type": "sentence_transformers.sparse_encoder.models.SpladePooling",
        },
    ]
    (out / "modules.json").write_text(json.dumps(modules, indent=2))
    (out / "1_SpladePooling").mkdir(exist_ok=True)
    pooling = {"pooling_strategy": pooling_strategy, "activation_function": "relu", "word_embedding_dimension": None}
    (out / "1_SpladePooling" / "config.json").write_text(json.dumps(pooling, indent=2))
    sentence_bert = {"max_seq_length": max_seq_length, "do_lower_case": False}
    (out / "sentence_bert_config.json").write_text(json.dumps(sentence_bert, indent=2))
    st = {"model_type": "SparseEncoder", "prompts": {}, "default_prompt_name": None, "similarity_fn_name": "dot"}
    (out / "config_sentence_transformers.json").write_text(json.dumps(st, indent=2))
    return out
