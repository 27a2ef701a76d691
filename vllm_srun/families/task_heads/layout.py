"""Which files of a package the family loads, and what they say.

Everything the family reads is named here, so `verify` hashes exactly the files `load` and the
engines use: config.json, tokenizer.json, tokenizer_config.json, the safetensors weights, the
ONNX graph, and for sentence-transformers embedders their configuration and modules (see
`sentence.py`; a PyLate ColBERT package's in `colbert.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_srun import defaults
from vllm_srun.errors import PackageError
from vllm_srun.families.task_heads import colbert as pylate
from vllm_srun.families.task_heads import logit_score
from vllm_srun.families.task_heads.cross_encoder import PairPrompts, read_pair_prompts
from vllm_srun.families.task_heads.sentence import SentenceConfig, read_sentence_config
from vllm_srun.families.task_heads.sparse_encoder import (
    SparseEncoderConfig,
    is_sparse_encoder,
    read_sparse_encoder,
)
from vllm_srun.plugins.architectures import LOGIT_SCORE_IDS, refusal, served_kind, standard_config
from vllm_srun.plugins.package import ONNX_PATHS, ModelPackage, checkpoint_max_tokens, usable_positions


@dataclass(frozen=True, kw_only=True)
class Layout:
    """A package as the family sees it. Paths are relative to the package root."""

    config: dict[str, Any]
    architecture: str
    kind: str  # "sequence", "token" or "embedding"
    weight_files: tuple[str, ...]
    onnx: str | None
    tokenizer_config: str | None
    sentence: SentenceConfig | None = None  # a sentence-transformers embedder's configuration
    max_tokens: int = defaults.FALLBACK_MAX_TOKENS
    # Output heads (engines/native/outputs.py) beyond the class's own: a SPLADE package's
    # masked-LM head, bge-m3's sparse and ColBERT linears; and the PyTorch state dicts that
    # hold the latter, by the prefix their tensors load under (hashed with `files()`, read by
    # the engine alone, with torch.load(weights_only=True)).
    output_heads: tuple[str, ...] = ()
    state_dicts: dict[str, str] = field(default_factory=dict)
    sparse_encoder: SparseEncoderConfig | None = None  # a sentence-transformers SPLADE package
    colbert: pylate.ColbertConfig | None = None  # a PyLate ColBERT package
    # A causal LM scored by two logits, as a sentence-transformers LogitScore package.
    logit_score: logit_score.LogitScoreConfig | None = None
    # A pair scorer's prompts, as sentence-transformers' CrossEncoder reads them (none for a
    # package it reads none from); None for a model that scores no pairs, and a LogitScore one.
    pair_prompts: PairPrompts | None = None

    @property
    def pooling(self) -> str | None:
        return self.sentence.pooling if self.sentence else None

    @property
    def normalize(self) -> bool:
        return self.sentence.normalize if self.sentence else False

    def files(self) -> list[str]:
        """Every file `load` or an engine reads, in a stable order."""
        names = ["config.json", "tokenizer.json", *self.weight_files]
        for optional in (self.tokenizer_config, self.onnx):
            if optional is not None:
                names.append(optional)
        if self.sentence is not None:
            names.extend(self.sentence.files())
        if self.sparse_encoder is not None:
            names.extend(self.sparse_encoder.files)
        if self.colbert is not None:
            names.extend(self.colbert.config_files)
        if self.logit_score is not None:
            names.extend(n for n in self.logit_score.config_files if n not in names)
        if self.pair_prompts is not None:
            names.extend(n for n in self.pair_prompts.config_files if n not in names)
        return names


def kind_of(config: dict[str, Any], package: ModelPackage) -> str | None:
    """The head kind a config declares ("sequence", "token", "embedding"), or None when the
    family does not serve it: the architecture table (vllm_srun.plugins.architectures) decides,
    and a package with an ONNX graph serves whatever its model_type."""
    found = served_kind(config, has_onnx=any(package.exists(p) for p in ONNX_PATHS))
    if found is None:
        return None
    kind, arch = found
    if logit_score.reads_logits(config) and not logit_score.is_logit_score(package):
        return None  # a causal LM serves only as a LogitScore package (`why_not`)
    if kind == "model":
        # SPLADE: a *ForMaskedLM checkpoint alone (naver/splade-*'s first form) or with a
        # sentence-transformers SparseEncoder's modules, where the row reads its masked-LM head.
        architecture = str(config["architectures"][0])
        sparse = arch is not None and arch.sparse_head is not None and architecture.endswith("ForMaskedLM")
        if package.exists("modules.json"):
            if is_sparse_encoder(package):
                return "sparse" if sparse else None
            return "embedding"
        return "sparse" if sparse else None
    return kind


# bge-m3's extra heads (FlagEmbedding's BGEM3 saves them beside the checkpoint): file -> the
# output head that reads it, which is also the prefix its tensors load under.
STATE_DICTS = {"sparse_linear.pt": "sparse_linear", "colbert_linear.pt": "colbert_linear"}


def _output_heads(
    kind: str, config: dict[str, Any], package: ModelPackage
) -> tuple[tuple[str, ...], dict[str, str]]:
    if kind == "sparse":
        found = served_kind(config, has_onnx=False)
        assert found is not None and found[1] is not None and found[1].sparse_head is not None
        return (found[1].sparse_head,), {}
    if kind != "embedding":
        return (), {}
    files = {head: name for name, head in STATE_DICTS.items() if package.exists(name, state_dict=True)}
    return tuple(files), files


def read_layout(package: ModelPackage) -> Layout:
    """The layout of `package`; PackageError names the file or setting that cannot be served."""
    config = package.read_json("config.json")
    if not isinstance(config, dict):
        raise PackageError(f"config.json in {package.name!r} is not a JSON object")
    kind = kind_of(config, package)
    if kind is None:
        raise PackageError(f"{package.name!r} is not a task_heads model: {why_not(config, package)}")
    config = standard_config(config)
    if not package.exists("tokenizer.json"):
        raise PackageError(f"{package.name!r} has no tokenizer.json (a fast tokenizer is required)")
    onnx = next((p for p in ONNX_PATHS if package.exists(p)), None)
    if logit_score.reads_logits(config):
        # A causal LM's graph answers vocabulary logits, not the score: only the native engine,
        # which builds the score from the weights, serves it.
        onnx = None
    weights = _weight_files(package, has_onnx=onnx is not None)
    tokenizer_config = "tokenizer_config.json" if package.exists("tokenizer_config.json") else None
    colbert = (
        pylate.read_colbert(package, int(config.get("hidden_size") or 0))
        if kind == "embedding" and pylate.is_pylate(package)
        else None
    )
    sentence = read_sentence_config(package) if kind == "embedding" and colbert is None else None
    sparse_encoder = read_sparse_encoder(package) if kind == "sparse" and package.exists("modules.json") else None
    scorer = logit_score.read_logit_score(package, config) if logit_score.reads_logits(config) else None
    pair_prompts = read_pair_prompts(package) if kind == "sequence" and scorer is None else None
    if scorer is not None:
        # One label, scored from the LM head's rows of the package's two tokens.
        config = {**config, LOGIT_SCORE_IDS: scorer.token_ids, "num_labels": 1, "id2label": {"0": "LABEL_0"}}
    max_tokens = checkpoint_max_tokens(package, config, tokenizer_config)
    if scorer is not None and scorer.max_seq_length is not None:
        max_tokens = min(scorer.max_seq_length, usable_positions(config))
    if sentence is not None and sentence.max_seq_length is not None:
        # sentence-transformers truncates at max_seq_length: that is the model's limit, within
        # the positions the checkpoint has.
        positions = usable_positions(config) if "max_position_embeddings" in config else sentence.max_seq_length
        max_tokens = min(sentence.max_seq_length, positions)
    if sparse_encoder is not None and sparse_encoder.max_seq_length is not None:
        max_tokens = min(sparse_encoder.max_seq_length, usable_positions(config))
    output_heads, state_dicts = _output_heads(kind, config, package)
    if colbert is not None:
        # PyLate truncates a document to document_length (its prefix included).
        max_tokens = min(colbert.document_length, usable_positions(config))
        output_heads, state_dicts = (pylate.HEAD,), dict(colbert.weights)
    return Layout(
        output_heads=output_heads,
        state_dicts=state_dicts,
        sparse_encoder=sparse_encoder,
        colbert=colbert,
        logit_score=scorer,
        pair_prompts=pair_prompts,
        config=config,
        architecture=config["architectures"][0],
        kind=kind,
        weight_files=weights,
        onnx=onnx,
        tokenizer_config=tokenizer_config,
        sentence=sentence,
        max_tokens=max_tokens,
    )


def why_not(config: dict[str, Any], package: ModelPackage) -> str:
    """Why `kind_of` refused a config, in words a user can act on."""
    if served_kind(config, has_onnx=False) is None and not any(package.exists(p) for p in ONNX_PATHS):
        return refusal(config)
    if logit_score.reads_logits(config):
        return refusal(config)  # a causal LM without the LogitScore module
    if package.exists("modules.json") and is_sparse_encoder(package):
        return (
            f"it is a sparse encoder (SpladePooling) of {(config.get('architectures') or [None])[0]!r}; "
            "SPLADE is served from the masked-LM head of the architectures whose row names one "
            "(BertForMaskedLM, DistilBertForMaskedLM)"
        )
    return (
        f"its architecture {(config.get('architectures') or [None])[0]!r} is a bare encoder without "
        "a sentence-transformers modules.json (nothing to serve: add modules.json and 1_Pooling for "
        "embeddings, or use a *ForSequenceClassification / *ForTokenClassification checkpoint)"
    )


def _weight_files(package: ModelPackage, *, has_onnx: bool) -> tuple[str, ...]:
    names = sorted(p.name for p in package.root.iterdir() if p.name.endswith(".safetensors"))
    for name in names:
        package.path(name)  # applies the symlink rule to every weight file
    if names or has_onnx:
        return tuple(names)
    if (package.root / "pytorch_model.bin").exists():
        raise PackageError(
            f"{package.name!r} has only pytorch_model.bin, a pickled checkpoint the runtime does not "
            "load; convert it to model.safetensors (safetensors.torch.save_file) or add onnx/model.onnx"
        )
    raise PackageError(f"{package.name!r} has no weights (*.safetensors or onnx/model.onnx)")
