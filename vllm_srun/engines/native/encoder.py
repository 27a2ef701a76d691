"""The one base class of every native architecture: forward, layers, early exits, weights.

An architecture module supplies a `Backbone` (embeddings, layers, an optional per-batch
context, a final step) and one `EncoderModel` subclass naming its checkpoint prefix; the head
is composed from `heads.py` by the name the architecture table declares. The forward over
packed rows or a small padded block, `num_layers`, `hidden_at` and weight loading by
checkpoint name are written here once.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from vllm_srun.engines.native.attention import Layout, Segments
from vllm_srun.engines.native.heads import Head, make_head
from vllm_srun.engines.native.weights import Stacked, load_named


class Backbone(nn.Module):
    """An encoder without its head: what an architecture module writes.

    `embed` maps token ids (and type ids, where the model has them) to the first hidden
    states [tokens, hidden]; `context` computes what every layer of one batch shares (None by
    default); each layer of `blocks` is called as `layer(x, layout, context)`; `final` is what
    runs after the last layer (identity by default; a final norm for pre-norm models).
    """

    def embed(self, input_ids: torch.Tensor, type_ids: torch.Tensor | None, layout: Layout) -> torch.Tensor:
        raise NotImplementedError

    @property
    def blocks(self) -> Sequence[nn.Module]:
        raise NotImplementedError

    def context(self, layout: Layout) -> Any:
        return None

    def final(self, x: torch.Tensor) -> torch.Tensor:
        return x


class EncoderModel(nn.Module):
    """What the engine calls on a native architecture.

    Built as `cls(config, head=name)`: `head` is a head name from `heads.HEADS` (None: a bare
    encoder). `forward` maps token ids laid out by a `Segments` (packed rows) or a `Block` (a
    padded small batch) to the final hidden states [tokens, hidden]; heads then run only on
    the rows that asked for them.

    Subclasses set `prefix` (the backbone's attribute and checkpoint prefix, e.g. "bert"),
    implement `build(config) -> Backbone`, and may set `stacked` (checkpoint tensors fused
    into one parameter), `optional` (backbone-relative checkpoint name prefixes dropped when no
    module takes them, e.g. a pooler a tagger does not use) and `ignored` (root-level
    prefixes of heads the runtime never runs, e.g. a masked-LM head).
    """

    prefix: ClassVar[str]
    stacked: ClassVar[Sequence[Stacked]] = ()
    optional: ClassVar[tuple[str, ...]] = ()
    ignored: ClassVar[tuple[str, ...]] = ()
    # The backbone-relative name of the input embedding table, which a head that reads the LM
    # head may find it tied to (heads.LogitScoreHead); "" where no head needs it.
    input_embeddings: ClassVar[str] = ""

    def __init__(self, config: Mapping[str, Any], *, head: str | None = None) -> None:
        super().__init__()
        self.vocab_size = int(config["vocab_size"])
        self.add_module(self.prefix, self.build(config))
        self.task_head: Head | None = None  # set first: a head may install a module named `head`
        self.task_head = make_head(head, self, config)

    def build(self, config: Mapping[str, Any]) -> Backbone:
        raise NotImplementedError

    @property
    def backbone(self) -> Backbone:
        module = getattr(self, self.prefix)
        assert isinstance(module, Backbone)
        return module

    @property
    def head_kind(self) -> str | None:
        """"sequence", "token" or None (a bare encoder)."""
        return self.task_head.kind if self.task_head is not None else None

    @property
    def num_layers(self) -> int:
        return len(self.backbone.blocks)

    def forward(self, input_ids: torch.Tensor, type_ids: torch.Tensor | None, layout: Layout) -> torch.Tensor:
        backbone = self.backbone
        x = backbone.embed(input_ids, type_ids, layout)
        context = backbone.context(layout)
        for layer in backbone.blocks:
            x = layer(x, layout, context)
        return backbone.final(x)

    def hidden_at(
        self,
        input_ids: torch.Tensor,
        type_ids: torch.Tensor | None,
        layout: Layout,
        layers: Collection[int],
    ) -> dict[int, torch.Tensor]:
        """The hidden states after each encoder layer in `layers` (1-based), running no layer
        past the deepest asked for. As Transformers' `hidden_states[layer]`: an earlier layer's
        output is the residual stream, the last layer's the model's output (after `final`)."""
        backbone = self.backbone
        x = backbone.embed(input_ids, type_ids, layout)
        context = backbone.context(layout)
        out: dict[int, torch.Tensor] = {}
        stack = backbone.blocks
        for number, layer in enumerate(stack[: max(layers)], start=1):
            x = layer(x, layout, context)
            if number in layers:
                # Each layer returns a fresh tensor: later layers leave this one as it is.
                out[number] = backbone.final(x) if number == len(stack) else x
        return out

    def sequence_logits(
        self, hidden: torch.Tensor, segments: Segments, rows: list[int], token_ids: np.ndarray
    ) -> torch.Tensor:
        """The head's logits of `rows`; `token_ids` are the batch's packed ids on the host."""
        if self.task_head is None or self.task_head.kind != "sequence":
            raise NotImplementedError(f"{type(self).__name__} has no sequence classification head")
        return self.task_head.sequence_logits(self, hidden, segments, rows, token_ids)

    def token_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.task_head is None or self.task_head.kind != "token":
            raise NotImplementedError(f"{type(self).__name__} has no token classification head")
        return self.task_head.token_logits(self, hidden)

    def load_weights(self, tensors: Mapping[str, torch.Tensor]) -> set[str]:
        """Fill every parameter from `tensors` by checkpoint name; return the names loaded (with
        those of any head parameter computed from them, heads.Head.derived)."""
        if self.task_head is not None:
            tensors = {**tensors, **self.task_head.derived(self, tensors)}
        return load_named(self, tensors, rename=self._rename, stacked=self.stacked, harmless=self._harmless)

    def _roots(self) -> tuple[str, ...]:
        """Top-level names a checkpoint tensor may start with as it is."""
        return tuple(f"{name}." for name, _ in self.named_children())

    def _rename(self, name: str) -> str:
        # Old TF-converted checkpoints spell LayerNorm parameters gamma/beta.
        name = name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        # A bare `*Model` is saved without the backbone prefix.
        return name if name.startswith(self._roots()) else f"{self.prefix}.{name}"

    def _harmless(self, name: str) -> bool:
        bare = name.removeprefix(f"{self.prefix}.")
        # Index buffers older transformers saved (positions are computed here).
        if bare.startswith("embeddings.") and bare.endswith(("position_ids", "token_type_ids")):
            return True
        if name.startswith(self.ignored) or bare.startswith(self.optional):
            # Dropped only where no parameter takes it: a head's own `head.` or `pooler.` loads.
            return self._rename(name) not in self._parameter_names()
        return False

    def _parameter_names(self) -> set[str]:
        names: set[str] | None = self.__dict__.get("_names")
        if names is None:
            names = {name for name, _ in self.named_parameters()}
            self.__dict__["_names"] = names
        return names
