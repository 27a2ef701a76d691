"""Task heads, composed onto any backbone by name (the architecture table names one per class).

A head installs its modules on the model at the dotted paths the checkpoint names them by
(`classifier`, `classifier.out_proj`, `bert.pooler`, `pre_classifier`, ...), so weights load
one to one; it keeps no module references of its own and reads them from the model at call
time (int8 quantisation swaps linears in place). A sequence head pools each asked-for row
(first token, or mean where the config says) and scores it; a token head scores every token.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Protocol

import numpy as np
import torch
from torch import nn

from vllm_srun.engines.native.attention import Segments
from vllm_srun.engines.native.layers import Activation, activation, first_tokens, mean_rows, num_labels
from vllm_srun.errors import ConfigError, PackageError
from vllm_srun.plugins.architectures import LOGIT_SCORE_IDS


class EncoderModel(Protocol):
    """What a head needs of the model it sits on (encoder.EncoderModel, which builds heads:
    named here structurally so the two modules do not import each other)."""

    prefix: str
    input_embeddings: str

    def get_submodule(self, target: str) -> nn.Module: ...

    def add_module(self, name: str, module: nn.Module | None) -> None: ...

    def __getattr__(self, name: str) -> Any: ...


def install(model: nn.Module, path: str, module: nn.Module) -> None:
    """Put `module` on `model` at the dotted checkpoint `path` (its parent must exist)."""
    parent_path, _, name = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    parent.add_module(name, module)


class Head:
    """A head: `kind` is "sequence" or "token"; `__init__` installs the modules.

    `sequence_logits` scores the asked-for `rows` of a packed batch; `token_ids` are the
    batch's packed ids on the host (Batch.token_ids, aligned with `hidden`), for a head whose
    choice of token depends on them (LastTokenScoreHead). Handing them over costs nothing: no
    other head reads them."""

    kind: ClassVar[str]

    def __init__(self, model: EncoderModel, config: Mapping[str, Any]) -> None:
        self.hidden = int(config["hidden_size"])
        self.labels = num_labels(config)

    def sequence_logits(
        self,
        model: EncoderModel,
        hidden: torch.Tensor,
        segments: Segments,
        rows: list[int],
        token_ids: np.ndarray,
    ) -> torch.Tensor:
        raise NotImplementedError

    def token_logits(self, model: EncoderModel, hidden: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def derived(self, model: EncoderModel, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Parameters of this head that are computed from the checkpoint's tensors rather than
        stored in it, by parameter name (none by default)."""
        return {}


class Pooler(nn.Module):
    """`dense` then an activation on the first token: BERT's pooler, DeBERTa's ContextPooler."""

    def __init__(self, width: int, act: Activation) -> None:
        super().__init__()
        self.dense = nn.Linear(width, width)
        self.act = act

    def forward(self, cls: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(cls))


class ClassificationHead(nn.Module):
    """`dense`, an activation, `out_proj`: RoBERTa's, ELECTRA's and MPNet's sequence heads."""

    def __init__(self, hidden: int, labels: int, act: Activation) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.act = act
        self.out_proj = nn.Linear(hidden, labels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_proj(self.act(self.dense(x)))


class PoolerHead(Head):
    """BERT: `<prefix>.pooler` (dense + tanh on [CLS]) then `classifier`."""

    kind = "sequence"

    def __init__(self, model: EncoderModel, config: Mapping[str, Any]) -> None:
        super().__init__(model, config)
        install(model, f"{model.prefix}.pooler", Pooler(self.hidden, torch.tanh))
        install(model, "classifier", nn.Linear(self.hidden, self.labels))

    def sequence_logits(
        self,
        model: EncoderModel,
        hidden: torch.Tensor,
        segments: Segments,
        rows: list[int],
        token_ids: np.ndarray,
    ) -> torch.Tensor:
        pooler = model.get_submodule(f"{model.prefix}.pooler")
        return model.classifier(pooler(first_tokens(hidden, segments, rows)))  # type: ignore[no-any-return]


class DenseHead(Head):
    """`classifier.dense` → activation → `classifier.out_proj` on the first token."""

    kind = "sequence"
    act: ClassVar[str] = "tanh"

    def __init__(self, model: EncoderModel, config: Mapping[str, Any]) -> None:
        super().__init__(model, config)
        install(model, "classifier", ClassificationHead(self.hidden, self.labels, activation(self.act)))

    def sequence_logits(
        self,
        model: EncoderModel,
        hidden: torch.Tensor,
        segments: Segments,
        rows: list[int],
        token_ids: np.ndarray,
    ) -> torch.Tensor:
        return model.classifier(first_tokens(hidden, segments, rows))  # type: ignore[no-any-return]


class GeluDenseHead(DenseHead):
    """ELECTRA's: the same shape with gelu (its authors' choice, as Transformers keeps it)."""

    act = "gelu"


class PreClassifierHead(Head):
    """DistilBERT: `pre_classifier` → ReLU → `classifier` on the first token."""

    kind = "sequence"

    def __init__(self, model: EncoderModel, config: Mapping[str, Any]) -> None:
        super().__init__(model, config)
        install(model, "pre_classifier", nn.Linear(self.hidden, self.hidden))
        install(model, "classifier", nn.Linear(self.hidden, self.labels))

    def sequence_logits(
        self,
        model: EncoderModel,
        hidden: torch.Tensor,
        segments: Segments,
        rows: list[int],
        token_ids: np.ndarray,
    ) -> torch.Tensor:
        x = torch.relu(model.pre_classifier(first_tokens(hidden, segments, rows)))
        return model.classifier(x)  # type: ignore[no-any-return]


class ContextPoolerHead(Head):
    """DeBERTa: `pooler.dense` → `pooler_hidden_act` on the first token, then `classifier`."""

    kind = "sequence"

    def __init__(self, model: EncoderModel, config: Mapping[str, Any]) -> None:
        super().__init__(model, config)
        width = int(config.get("pooler_hidden_size") or self.hidden)
        install(model, "pooler", Pooler(width, activation(config.get("pooler_hidden_act", "gelu"))))
        install(model, "classifier", nn.Linear(width, self.labels))

    def sequence_logits(
        self,
        model: EncoderModel,
        hidden: torch.Tensor,
        segments: Segments,
        rows: list[int],
        token_ids: np.ndarray,
    ) -> torch.Tensor:
        return model.classifier(model.pooler(first_tokens(hidden, segments, rows)))  # type: ignore[no-any-return]


class PredictionHead(nn.Module):
    """ModernBERT's `head`: dense → activation → norm."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        hidden = int(config["hidden_size"])
        self.dense = nn.Linear(hidden, hidden, bias=config.get("classifier_bias", False))
        self.act = activation(config.get("classifier_activation", "gelu"))
        self.norm = nn.LayerNorm(hidden, eps=config.get("norm_eps", 1e-5), bias=config.get("norm_bias", False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(x)))


class ModernBertHead(Head):
    """ModernBERT: rows pooled by `classifier_pooling` (cls or mean), then `head`, `classifier`.
    The reference gives the classifier a bias whatever classifier_bias says (that flag is the
    head's dense layer)."""

    kind = "sequence"

    def __init__(self, model: EncoderModel, config: Mapping[str, Any]) -> None:
        super().__init__(model, config)
        self.pooling = config.get("classifier_pooling", "cls")
        if self.pooling not in ("cls", "mean"):
            raise ConfigError(f"classifier_pooling {self.pooling!r} is not supported ('cls' or 'mean')")
        install(model, "head", PredictionHead(config))
        install(model, "classifier", nn.Linear(self.hidden, self.labels))

    def sequence_logits(
        self,
        model: EncoderModel,
        hidden: torch.Tensor,
        segments: Segments,
        rows: list[int],
        token_ids: np.ndarray,
    ) -> torch.Tensor:
        pool = mean_rows if self.pooling == "mean" else first_tokens
        return model.classifier(model.head(pool(hidden, segments, rows).to(hidden.dtype)))  # type: ignore[no-any-return]

    def token_logits(self, model: EncoderModel, hidden: torch.Tensor) -> torch.Tensor:
        return model.classifier(model.head(hidden))  # type: ignore[no-any-return]


class TokenHead(Head):
    """One linear on every token, at `module`: `classifier` (with a bias), the token tagger of
    BERT-like encoders."""

    kind = "token"
    module: ClassVar[str] = "classifier"

    def __init__(self, model: EncoderModel, config: Mapping[str, Any]) -> None:
        super().__init__(model, config)
        install(model, self.module, nn.Linear(self.hidden, self.labels, bias=self.has_bias(config)))

    def has_bias(self, config: Mapping[str, Any]) -> bool:
        return True

    def token_logits(self, model: EncoderModel, hidden: torch.Tensor) -> torch.Tensor:
        return getattr(model, self.module)(hidden)  # type: ignore[no-any-return]


class ScoreTokenHead(TokenHead):
    """A decoder's *ForTokenClassification (Transformers' GenericForTokenClassification): the
    linear is `score`, with a bias unless config.json's `token_classification_bias` is false;
    its dropout does nothing at inference."""

    module = "score"

    def has_bias(self, config: Mapping[str, Any]) -> bool:
        return bool(config.get("token_classification_bias", True))


class ModernBertTokenHead(ModernBertHead):
    """ModernBERT's tagger: `head` then `classifier` on every token."""

    kind = "token"


class LastTokenScoreHead(Head):
    """A decoder's *ForSequenceClassification: `score` (no bias) on one token of each row.

    The token is the one Transformers scores (GenericForSequenceClassification): the rightmost
    whose id is not config.json's `pad_token_id`, wherever the padding is, so a row that ends
    in pad ids (a tokenizer that appends its pad token, as Qwen's `<|endoftext|>` is both)
    is scored at the token before them; a row of pad ids only at its first token (the
    reference's argmax over no match, on an unpadded row); with no `pad_token_id`, the last
    token (the reference then runs a batch of one only)."""

    kind = "sequence"
    # Whether the scored token skips trailing pad ids (the reference's choice) or is the row's
    # last, as a LogitScore module reads it.
    skips_pad: ClassVar[bool] = True

    def __init__(self, model: EncoderModel, config: Mapping[str, Any]) -> None:
        super().__init__(model, config)
        pad = config.get("pad_token_id")
        self.pad_id = int(pad) if self.skips_pad and isinstance(pad, int) else None
        install(model, "score", nn.Linear(self.hidden, self.labels, bias=False))

    def scored_tokens(self, segments: Segments, rows: list[int], token_ids: np.ndarray) -> list[int]:
        """The packed position each of `rows` is scored at."""
        ends = [segments.starts[r] + segments.lengths[r] for r in rows]
        if self.pad_id is None:
            return [end - 1 for end in ends]
        out = []
        for r, end in zip(rows, ends, strict=True):
            start = segments.starts[r]
            kept = np.flatnonzero(token_ids[start:end] != self.pad_id)
            out.append(start + (int(kept[-1]) if len(kept) else 0))
        return out

    def sequence_logits(
        self,
        model: EncoderModel,
        hidden: torch.Tensor,
        segments: Segments,
        rows: list[int],
        token_ids: np.ndarray,
    ) -> torch.Tensor:
        return model.score(hidden[self.scored_tokens(segments, rows, token_ids)])  # type: ignore[no-any-return]


class LogitScoreHead(LastTokenScoreHead):
    """A causal LM read as a reranker by two vocabulary logits of each row's last token, as
    sentence-transformers' LogitScore module scores it: logit[true] - logit[false], or
    logit[true] alone when the package names no false token.

    Both logits are rows of the LM head applied to the last hidden state, so their difference is
    one linear map of it: `score.weight` = lm_head[true] - lm_head[false] (shape [1, hidden]),
    built at load from the checkpoint's `lm_head.weight`, or from the input embeddings where
    `tie_word_embeddings` shares them (Qwen3-0.6B's checkpoint stores no lm_head). The token ids
    come from the config under `LOGIT_SCORE_IDS`, where the family puts the package's. The
    scored token is the row's last, whatever its id: sentence-transformers left-pads, so the
    module reads the last position, a real token."""

    skips_pad = False

    def __init__(self, model: EncoderModel, config: Mapping[str, Any]) -> None:
        ids = config.get(LOGIT_SCORE_IDS)
        if not isinstance(ids, list | tuple) or len(ids) != 2 or not isinstance(ids[0], int):
            raise ConfigError(f"a LogitScore head needs {LOGIT_SCORE_IDS}: [true id, false id or null]")
        vocab = int(config["vocab_size"])
        for which, token in zip(("true", "false"), ids, strict=True):
            if token is not None and not (isinstance(token, int) and 0 <= token < vocab):
                raise ConfigError(
                    f"LogitScore {which}_token_id {token!r} is outside the vocabulary (size {vocab})"
                )
        self.true_id, self.false_id = int(ids[0]), None if ids[1] is None else int(ids[1])
        self.tied = bool(config.get("tie_word_embeddings", False))
        super().__init__(model, {**config, "num_labels": 1, "id2label": {"0": "LABEL_0"}})

    def derived(self, model: EncoderModel, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        source = f"{model.prefix}.{model.input_embeddings}" if self.tied else "lm_head.weight"
        rows = tensors.get(source)
        if rows is None:
            tied = "tie_word_embeddings is true" if self.tied else "tie_word_embeddings is false"
            raise PackageError(f"the LogitScore head reads {source!r} ({tied}); the weights have none")
        weight = rows[self.true_id]
        if self.false_id is not None:
            weight = weight - rows[self.false_id]
        return {"score.weight": weight.reshape(1, -1)}


# Head names as the architecture table (vllm_srun.plugins.architectures) spells them.
HEADS: dict[str, type[Head]] = {
    "pooler": PoolerHead,
    "dense": DenseHead,
    "dense_gelu": GeluDenseHead,
    "pre_classifier": PreClassifierHead,
    "context_pooler": ContextPoolerHead,
    "modernbert": ModernBertHead,
    "token": TokenHead,
    "score_token": ScoreTokenHead,
    "modernbert_token": ModernBertTokenHead,
    "last_token_score": LastTokenScoreHead,
    "logit_score": LogitScoreHead,
}


def make_head(name: str | None, model: EncoderModel, config: Mapping[str, Any]) -> Head | None:
    if name is None:
        return None
    cls = HEADS.get(name)
    if cls is None:
        raise ConfigError(f"unknown head {name!r} (known: {', '.join(HEADS)})")
    return cls(model, config)
