"""`TaskHeadsBase`: what a task_heads model holds (tokenizer, labels, pooling, outputs; never
weights) and the planning steps every surface shares: head choice, the long-input policy,
tokenizing within bounds, and work items with their cache-key parts."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from tokenizers import Tokenizer

from vllm_srun.defaults import FALLBACK_MAX_TOKENS
from vllm_srun.errors import InvalidRequest
from vllm_srun.families.task_heads import colbert as pylate
from vllm_srun.families.task_heads.cross_encoder import PairPrompts, bound_prompt
from vllm_srun.families.task_heads.heads import POOLED, SURFACES_OF, TOKEN
from vllm_srun.families.task_heads.logit_score import PairTemplate
from vllm_srun.families.task_heads.outputs import OutputKinds
from vllm_srun.families.task_heads.plan_state import PlannedInput, PlanState
from vllm_srun.families.task_heads.sentence import PostPooling, SentenceConfig
from vllm_srun.families.task_heads.tokenize import Encoded, TextEncoder
from vllm_srun.families.task_heads.windows import Overflow, bound_chars, split
from vllm_srun.plugins.base import EngineModel, HeadInfo, LoadedModel, ModelInfo, Plan, WorkItem
from vllm_srun.plugins.bodies import UnsupportedOption
from vllm_srun.plugins.surfaces import Options


def _type_runs(types: np.ndarray) -> str:
    """Run lengths of the token type ids, e.g. "0x5,1x3": they change the result, so they
    belong in the cache key next to the token ids."""
    runs: list[str] = []
    start = 0
    for i in range(1, len(types) + 1):
        if i == len(types) or types[i] != types[start]:
            runs.append(f"{int(types[start])}x{i - start}")
            start = i
    return ",".join(runs)


class TaskHeadsBase(LoadedModel):
    """A BERT or ModernBERT model with a task head: its parts and the shared planning steps."""

    batch_invariant = False
    # An over-long embeddings input with no options.overflow is a 400 (OpenAI's contract).
    unset_overflow_surfaces = frozenset({"embeddings"})

    def __init__(
        self,
        info: ModelInfo,
        engine_model: EngineModel | None,
        *,
        encoder: TextEncoder,
        labels: list[str],
        pooling: str | None,
        normalize: bool,
        uses_type_ids: bool,
        hidden_size: int = 0,
        sentence: SentenceConfig | None = None,
        post_pooling: PostPooling | None = None,
        num_layers: int = 0,
        outputs: OutputKinds | None = None,
        colbert: pylate.Codec | None = None,
        pair_template: PairTemplate | None = None,
        pair_prompts: PairPrompts | None = None,
    ) -> None:
        super().__init__(info, engine_model)
        self.encoder = encoder
        self.labels = labels
        self.pooling = pooling
        self.normalize = normalize
        self.uses_type_ids = uses_type_ids
        self.hidden_size = hidden_size or (info.embedding.dimension if info.embedding else 0)
        self.sentence = sentence
        self.post_pooling = post_pooling or PostPooling()
        self.max_tokens = info.max_tokens or FALLBACK_MAX_TOKENS
        self.heads = {head.name: head for head in info.heads}
        self.num_layers = num_layers  # encoder layers: the last is the exit every surface serves
        self.outputs = outputs or OutputKinds()
        self.colbert = colbert  # a PyLate ColBERT package's rows (colbert.py)
        self.pair_template = pair_template  # a LogitScore package's pair format (logit_score.py)
        self.pair_prompts = pair_prompts  # a cross-encoder's prompts (cross_encoder.py)

    def tokenizer(self) -> Tokenizer:
        return self.encoder.tokenizer

    def prompts(self) -> dict[str, str]:
        return dict(self.sentence.prompts) if self.sentence is not None else {}

    def head(self, surface: str, name: str | None, field: str = "options.head") -> HeadInfo:
        """The head named `name` (by default the first that answers `surface`); `field` names
        the request field in a refusal."""
        if name is None:
            return next(h for h in self.info.heads if surface in SURFACES_OF[h.kind])
        head = self.heads.get(name)
        if head is None:
            raise UnsupportedOption(f"{field}: no head {name!r}; heads: {', '.join(self.heads)}", param=field)
        if surface not in SURFACES_OF[head.kind]:
            serving = [h.name for h in self.info.heads if surface in SURFACES_OF[h.kind]]
            raise UnsupportedOption(
                f"{field}: head {head.name!r} does not answer {surface}; heads that do: {', '.join(serving)}",
                param=field,
            )
        return head

    def budget(self, options: Options) -> tuple[int, str]:
        """The per-input token budget and whose it is: `options.max_tokens`, at most the model's."""
        if options.max_tokens is None:
            return self.max_tokens, "the model takes at most"
        if options.max_tokens > self.max_tokens:
            raise UnsupportedOption(
                f"options.max_tokens: {options.max_tokens} exceeds the model's limit of {self.max_tokens} tokens",
                param="options.max_tokens",
            )
        return options.max_tokens, "options.max_tokens allows at most"

    def policy(self, options: Options) -> Overflow:
        """The long-input policy `options` ask for, checked against the model's budget."""
        mode = options.overflow_mode
        budget, limit = self.budget(options)
        if options.window is not None and mode != "window":
            raise InvalidRequest("options.window: applies only with options.overflow 'window'")
        if mode != "window":
            return Overflow(mode, budget, left=options.truncation_direction == "left", limit=limit)
        # Without window options: windows as long as the budget, sharing an eighth.
        tokens = options.window.tokens if options.window else budget
        overlap = options.window.overlap if options.window else budget // 8
        # Without window options the windows follow the budget: a bad one is max_tokens's fault.
        size_field = "options.window.tokens" if options.window else "options.max_tokens"
        overlap_field = "options.window.overlap" if options.window else "options.max_tokens"
        if tokens > budget:
            # Past the model's limit it is the model's refusal (422); past max_tokens, the request's.
            refusal = UnsupportedOption if options.max_tokens is None else InvalidRequest
            whose = "the model's limit" if options.max_tokens is None else "options.max_tokens"
            raise refusal(f"options.window.tokens: {tokens} exceeds {whose} of {budget} tokens")
        # The room a window leaves depends on the model's special tokens: its refusal (422).
        room = tokens - self.encoder.special_tokens(pair=False)
        if room < 2:
            raise UnsupportedOption(
                f"{size_field}: windows of {tokens} tokens leave {max(room, 0)} text tokens after the "
                f"{tokens - room} special tokens; at least 2 are needed",
                param=size_field,
            )
        if room - overlap < 1:
            raise UnsupportedOption(
                f"{overlap_field}: an overlap of {overlap} must be smaller than the {room} text tokens a "
                f"window of {tokens} holds",
                param=overlap_field,
            )
        return Overflow("window", budget, tokens, overlap, limit=limit)

    def plan_pairs(
        self,
        surface: str,
        head: HeadInfo,
        options: Options,
        pairs: Sequence[tuple[str, str | None]],
        params: Sequence[str] | None = None,
        *,
        output: str | None = None,
        policy: Overflow | None = None,
        prompt: str | None = None,
    ) -> Plan:
        """Tokenize and plan `pairs`, each first bounded in characters (`params` names their
        fields; by default input[i]); `prompt` is a pair scorer's (its default if None)."""
        params = params or [f"input[{i}]" for i in range(len(pairs))]
        texts = [text for text, _ in pairs]
        encs = self.encode_bounded(pairs, options, params, prompt=prompt)
        return self.plan_encoded(surface, head, options, texts, encs, output=output, policy=policy)

    def encode_bounded(
        self,
        pairs: Sequence[tuple[str, str | None]],
        options: Options,
        params: Sequence[str],
        *,
        prompt: str | None = None,
    ) -> list[Encoded]:
        """`pairs` tokenized within their character bound (windows.bound_chars): an input past it
        under `reject` is tokenized only up to it and marked clipped."""
        template, policy = self.pair_template, self.policy(options)
        # A pair scorer's prompt goes into every pair (rendered by a LogitScore reranker's
        # template, else before each first text, as CrossEncoder.predict puts it): it counts in
        # each bound, and one longer than any input may be is refused before it is copied.
        chosen = self._default_prompt() if prompt is None else prompt
        if chosen:
            bound_prompt(chosen, policy)
        clips = bound_chars([len(t) + len(p or "") + len(chosen) for t, p in pairs], policy, params)
        bounded = [
            (t, p) if clip is None else (t[:clip], None if p is None else p[:clip])
            for (t, p), clip in zip(pairs, clips, strict=True)
        ]
        if template is not None:  # each pair rendered through the chat template
            encs = template.encode(bounded, params, prompt=chosen, policy=policy)
        else:
            encs = self.encoder.encode([(chosen + t, p) for t, p in bounded] if chosen else bounded)
        return [
            enc if clip is None else dataclasses.replace(enc, clipped=True)
            for enc, clip in zip(encs, clips, strict=True)
        ]

    def plan_encoded(
        self,
        surface: str,
        head: HeadInfo,
        options: Options,
        texts: Sequence[str],
        encs: Sequence[Encoded],
        *,
        skip: int = 0,
        output: str | None = None,
        policy: Overflow | None = None,
    ) -> Plan:
        """Work items for `encs`; `output` (an engine output) overrides the head's own, and
        `policy` the options' long-input policy."""
        policy = policy or self.policy(options)
        if policy.mode == "window" and head.kind == POOLED and self.pooling == "last":
            # A window's last token has read only that window (and in a decoder, only what came
            # before it): the mean of such vectors is no embedding of the text.
            raise UnsupportedOption(
                "options.overflow: 'window' is not served for a model that pools by its last token "
                f"(model {self.info.name!r}): each window's last token would stand for that window "
                "alone; use 'truncate' or 'reject'",
                param="options.overflow",
            )
        output = output or self._output(head, skip=skip)
        items: list[WorkItem] = []
        inputs: list[PlannedInput] = []
        for text, enc in zip(texts, encs, strict=True):
            parts = split(enc, policy)
            indexes = []
            for piece in parts.pieces:
                indexes.append(len(items))
                items.append(self._item(enc, piece, output))
            inputs.append(PlannedInput(text=text, enc=enc, split=parts, items=indexes))
        state = PlanState(head=head, output=output, options=options, inputs=inputs, skip=skip)
        return Plan(surface=surface, items=items, state=state)

    def colbert_policy(self, options: Options, role: str) -> Overflow:
        """The long-input policy of a PyLate `role`: its budget is query_length or
        document_length (at most `options.max_tokens`), less the prefix token it inserts."""
        assert self.colbert is not None
        policy = self.policy(options)
        budget = min(policy.max_tokens, self.colbert.length(role))
        prefix = self.colbert.length(role) - self.colbert.budget(role)
        limit = ("less its prefix token, " if prefix else "") + f"a {role} of this model takes at most"
        return dataclasses.replace(policy, max_tokens=budget - prefix, limit=limit)

    def colbert_rows(self, items: list[WorkItem], planned: Sequence[PlannedInput], role: str) -> None:
        """Make `planned`'s items PyLate's rows of `role`: the prefix in, a query expanded;
        tokens that are not attention keys enter the cache key with the count that are."""
        assert self.colbert is not None
        for one in planned:
            one.role = role
            for index in one.items:
                item = items[index]
                item.token_ids, item.key_tokens = self.colbert.row(item.token_ids, role)
                if item.key_tokens:
                    item.key_extra += f"/keys={item.key_tokens}"

    def _default_prompt(self) -> str:
        """The prompt a pair scorer's inputs get when the request names none ("" for none)."""
        if self.pair_template is not None:
            return self.pair_template.default_prompt()
        return self.pair_prompts.default_prompt() if self.pair_prompts is not None else ""

    def _output(self, head: HeadInfo, *, skip: int = 0) -> str:
        if head.kind == TOKEN:
            return "token_logits"
        if head.kind == POOLED:
            # Pooling that leaves out a prompt's tokens is done in finish, from the token states.
            return "hidden" if skip else self.pooling or "mean"
        return "logits"

    def _item(self, enc: Encoded, piece: np.ndarray, output: str) -> WorkItem:
        key = f"task_heads/{output}"
        type_ids = None
        if self.uses_type_ids and enc.is_pair:
            types = enc.type_ids[piece]
            type_ids = types.tolist()
            key += "/types=" + _type_runs(types)
        return WorkItem(token_ids=enc.ids[piece].tolist(), type_ids=type_ids, output=output, key_extra=key)
