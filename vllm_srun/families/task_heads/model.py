"""`TaskHeadsModel`: plans classify, embeddings and rerank requests into work items and
finishes the engine's raw rows into responses. It holds a tokenizer, never weights, so an app
replica can plan and finish without torch or onnxruntime.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

import msgspec
import numpy as np
from tokenizers import Tokenizer

from vllm_srun.defaults import FALLBACK_MAX_TOKENS
from vllm_srun.errors import InvalidRequest, UnsupportedSurface
from vllm_srun.families.task_heads import colbert as pylate
from vllm_srun.families.task_heads import finish, outputs
from vllm_srun.families.task_heads.cross_encoder import PairPrompts, bound_prompt, refuse_prompt
from vllm_srun.families.task_heads.heads import POOLED, SCORES, SURFACES_OF, TOKEN, pool_tokens
from vllm_srun.families.task_heads.logit_score import PairTemplate
from vllm_srun.families.task_heads.outputs import OutputKinds
from vllm_srun.families.task_heads.sentence import (
    PostPooling,
    SentenceConfig,
    at_layer,
    exit_layer,
    prompt_length,
    select_prompt,
)
from vllm_srun.families.task_heads.tokenize import Encoded, TextEncoder
from vllm_srun.families.task_heads.windows import Overflow, Split, bound_chars, split
from vllm_srun.plugins.base import (
    EngineModel,
    HeadInfo,
    ItemError,
    LoadedModel,
    ModelInfo,
    Plan,
    Result,
    WorkItem,
)
from vllm_srun.plugins.bodies import REFUSAL_HINT, UnsupportedOption, check_profile
from vllm_srun.plugins.surfaces import (
    ClassifyRequest,
    EmbeddingsRequest,
    Options,
    RerankDocument,
    RerankRequest,
    texts_of,
)


@dataclass(eq=False)
class PlannedInput:
    """One input of a request: its text, tokens, how it was split and its work items."""

    text: str
    enc: Encoded
    split: Split
    items: list[int]
    # A PyLate ColBERT row's role ("query" or "document", colbert.py): its row holds a prefix
    # token and, for a query, expansion tokens beyond `enc`'s.
    role: str | None = None


class SurfaceOptions(TypedDict, total=False):
    """The request fields finish needs beyond `Options`, by surface: embeddings' `dimensions`,
    `encoding_format` and `layer` (the exit used), rerank's `top_n` and `return_documents`.
    Absent means the default."""

    dimensions: int | None
    encoding_format: str
    top_n: int | None
    return_documents: bool
    layer: int | None
    output: str  # options.output in force (outputs.py): absent means dense


@dataclass(eq=False)
class PlanState:
    """What finish needs from plan: kept on the replica that planned, never serialised."""

    head: HeadInfo
    output: str
    options: Options
    inputs: list[PlannedInput]
    query: PlannedInput | None = None  # rerank by embedding cosine: the query's own input
    extra: SurfaceOptions = field(default_factory=SurfaceOptions)
    # Leading positions that pooling leaves out: a prompt, under a Pooling with include_prompt
    # false. The engine then returns token states ("hidden") and finish pools them.
    skip: int = 0


# The classify options only some heads read (finish.classify), by the head kinds that read them.
HEAD_OPTIONS = {"threshold": frozenset({TOKEN, SCORES}), "return_tokens": frozenset({TOKEN})}


def _refuse_unread(head: HeadInfo, options: Options) -> None:
    """An UnsupportedOption (422) naming a classify option `head` does not read: the surface takes it,
    but this head would answer as if it were unset."""
    given = msgspec.to_builtins(options)  # omit_defaults: only what the request set
    for option, kinds in HEAD_OPTIONS.items():
        if option in given and head.kind not in kinds:
            field = f"options.{option}"
            raise UnsupportedOption(  # the head's refusal, not the document's: 422
                f"{field}: the {head.kind} head {head.name!r} does not read it (only a "
                f"{' or '.join(sorted(kinds))} head does)",
                param=field,
            )


def _fits(shape: tuple[int, ...], expected: tuple[int | None, ...]) -> bool:
    return len(shape) == len(expected) and all(
        e is None or s == e for s, e in zip(shape, expected, strict=True)
    )


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


class TaskHeadsModel(LoadedModel):
    """A BERT or ModernBERT model with a task head, on the classify/embeddings/rerank surfaces."""

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

    # Planning -------------------------------------------------------------------------------

    def plan_surface(self, surface: str, request: Any) -> Plan:
        if surface not in self.info.surfaces:
            raise UnsupportedSurface(
                f"model {self.info.name!r} does not serve {surface!r}; it serves "
                f"{', '.join(self.info.surfaces) or 'nothing'}"
            )
        check_profile(request.options, self.info.numerics)
        if surface == "classify" and isinstance(request, ClassifyRequest):
            return self._plan_classify(request)
        if surface == "embeddings" and isinstance(request, EmbeddingsRequest):
            return self._plan_embeddings(request)
        if surface == "rerank" and isinstance(request, RerankRequest):
            return self._plan_rerank(request)
        raise InvalidRequest(f"a {surface} request was expected, got {type(request).__name__}")

    def _plan_classify(self, request: ClassifyRequest) -> Plan:
        head = self._head("classify", request.head_name(), "options.head" if request.head is None else "head")
        pairs = texts_of(request.input)
        if not pairs:
            raise InvalidRequest("input: must not be empty")
        if head.kind == TOKEN:
            for i, (_, pair) in enumerate(pairs):
                if pair is not None:
                    raise UnsupportedOption(f"input[{i}].text_pair: the token head tags single texts")
        _refuse_unread(head, request.options)
        single = isinstance(request.input, str)
        return self._plan("classify", head, request.options, pairs, ["input"] if single else None)

    def _plan_embeddings(self, request: EmbeddingsRequest) -> Plan:
        head = self._head("embeddings", request.options.head)
        inputs = request.inputs()
        if not inputs:
            raise InvalidRequest("input: must not be empty", param="input")
        kind = request.options.output or self.outputs.default
        self.outputs.check(kind, model=self.info.name)
        if kind != outputs.DENSE:
            return self._plan_other_output(request, head, inputs, kind)
        dimension = self.info.embedding.dimension if self.info.embedding else 0
        if request.dimensions is not None and request.dimensions > dimension:
            raise UnsupportedOption(
                f"dimensions: {request.dimensions} exceeds the model's dimension {dimension}",
                param="dimensions",
            )
        layers = self.info.embedding.layers if self.info.embedding else []
        layer = exit_layer(request.layer, layers, model=self.info.name)
        single, prompt, encs = self._embedding_inputs(request, inputs)
        names = [i if isinstance(i, str) else "" for i in inputs]
        skip = 0
        if prompt and self.sentence is not None and not self.sentence.include_prompt:
            ids = self.encoder.tokenizer.encode(prompt, add_special_tokens=True).ids
            skip = prompt_length(ids, self.encoder.special_ids)
        plan = self._plan_encoded("embeddings", head, request.options, names, encs, skip=skip)
        if layer is not None:
            at_layer(plan.items, layer)
        if request.options.overflow is None:
            self._refuse_overlong(plan.state, single=single)
        plan.state.extra = SurfaceOptions(
            dimensions=request.dimensions, encoding_format=request.encoding_format, layer=layer
        )
        return plan

    def _embedding_inputs(
        self, request: EmbeddingsRequest, inputs: list[str | list[int]]
    ) -> tuple[bool, str, list[Encoded]]:
        """(whether `input` is one input, the prompt, each input encoded): texts with the prompt
        in front, bounded in characters; token ids as given, each checked against the vocabulary."""
        # One text or one list of ids: OpenAI names the field itself, not an element of it.
        single = isinstance(request.input, str) or all(isinstance(v, int) for v in request.input)
        prompt = select_prompt(
            self.sentence,
            model=self.info.name,
            prompt=request.prompt,
            prompt_name=request.prompt_name,
            input_type=request.input_type,
            token_ids=any(isinstance(i, list) for i in inputs),
        )
        params = ["input" if single else f"input[{i}]" for i, v in enumerate(inputs) if isinstance(v, str)]
        texts = [prompt + t for t in inputs if isinstance(t, str)]
        encoded = iter(self._encode_bounded([(t, None) for t in texts], request.options, params))
        encs: list[Encoded] = []
        for index, value in enumerate(inputs):
            enc = next(encoded) if isinstance(value, str) else self.encoder.ids_input(value)
            if isinstance(enc, int):
                assert isinstance(value, list)
                param = "input" if single else f"input[{index}]"
                raise UnsupportedOption(  # the vocabulary is the model's: 422
                    f"{param}: token id {value[enc]} (at {enc}) is not in the model's vocabulary of "
                    f"{self.encoder.vocab_size}",
                    param=param,
                )
            encs.append(enc)
        return single, prompt, encs

    def _plan_other_output(
        self, request: EmbeddingsRequest, head: HeadInfo, inputs: list[str | list[int]], kind: str
    ) -> Plan:
        """Sparse, multi-vector or token embeddings: one engine row per input, read whole or
        truncated (windows would need a rule to join them that no reference has)."""
        outputs.refuse_with(
            kind,
            {
                "dimensions": request.dimensions,
                "layer": request.layer,
                "options.normalize": request.options.normalize,
                "encoding_format": "base64" if request.encoding_format == "base64" else None,
                "options.overflow": "window" if request.options.overflow == "window" else None,
            },
        )
        role = None
        if self.colbert is not None and kind == outputs.MULTI_VECTOR:
            # PyLate encodes a query or a document; input_type says which, not a prompt.
            role = request.input_type or pylate.DOCUMENT
            request = msgspec.structs.replace(request, input_type=None)
            self._refuse_ids(inputs)
        single, _, encs = self._embedding_inputs(request, inputs)
        names = [i if isinstance(i, str) else "" for i in inputs]
        engine_output = self.outputs.engine_output(kind)
        policy = None if role is None else self._colbert_policy(request.options, role)
        plan = self._plan_encoded(
            "embeddings", head, request.options, names, encs, output=engine_output, policy=policy
        )
        if role is not None:
            self._colbert_rows(plan.items, plan.state.inputs, role)
        if request.options.overflow is None:
            self._refuse_overlong(plan.state, single=single, policy=policy)
        plan.state.extra = SurfaceOptions(encoding_format=request.encoding_format, output=kind)
        return plan

    def _refuse_overlong(self, state: PlanState, *, single: bool, policy: Overflow | None = None) -> None:
        """OpenAI's contract: an over-long input fails the request, never a 200 with a null
        vector, unless the request or the server asks for truncation."""
        for index, planned in enumerate(state.inputs):
            if planned.split.error is None:
                continue
            param = "input" if single else f"input[{index}]"
            budget, limit = self._budget(state.options) if policy is None else (policy.max_tokens, policy.limit)
            info = planned.split.info
            count = f"at least {info.tokens} tokens" if info.tokens_lower_bound else f"{info.tokens} tokens"
            raise InvalidRequest(f"{param}: input has {count}; {limit} {budget} {REFUSAL_HINT}", param=param)

    def _plan_rerank(self, request: RerankRequest) -> Plan:
        head = self._head("rerank", request.options.head)
        self._check_exit(request)
        if head.kind == POOLED:
            refuse_prompt(request, self.info.name)
        documents = [d.text if isinstance(d, RerankDocument) else d for d in request.documents]
        if not documents:
            raise InvalidRequest("documents: must not be empty")
        kind = request.options.output or (outputs.DENSE if self.outputs.dense else outputs.MULTI_VECTOR)
        if kind not in (outputs.DENSE, outputs.MULTI_VECTOR):
            raise InvalidRequest(
                f"options.output: rerank scores by 'dense' or 'multi_vector' (MaxSim), not {kind!r}",
                param="options.output",
            )
        if kind == outputs.MULTI_VECTOR:
            if head.kind != POOLED:
                raise UnsupportedOption(
                    f"options.output: 'multi_vector' reranks with an embedder's token vectors; the "
                    f"{head.kind} head {head.name!r} scores pairs",
                    param="options.output",
                )
            if request.options.overflow == "window":
                raise InvalidRequest(
                    "options.overflow: 'window' does not apply to multi_vector rerank",
                    param="options.overflow",
                )
            self.outputs.check(kind, model=self.info.name)
        if kind == outputs.DENSE and head.kind == POOLED:
            self.outputs.check(kind, model=self.info.name)  # a PyLate package pools nothing
        if kind == outputs.MULTI_VECTOR and self.colbert is not None:
            plan = self._plan_colbert_rerank(request, head, documents)
        elif head.kind == POOLED:
            # Bi-encoder: the query is embedded once, as an extra input planned first.
            params = ["query"] + [f"documents[{i}]" for i in range(len(documents))]
            pairs: list[tuple[str, str | None]] = [(request.query, None)] + [(d, None) for d in documents]
            output = self.outputs.engine_output(kind) if kind != outputs.DENSE else None
            plan = self._plan("rerank", head, request.options, pairs, params, output=output)
            plan.state.query = plan.state.inputs.pop(0)
        else:
            bound_chars([len(request.query)], self._policy(request.options), ["query"])
            params = [f"documents[{i}]" for i in range(len(documents))]
            plan = self._plan(
                "rerank", head, request.options, [(request.query, d) for d in documents], params,
                prompt=self._rerank_prompt(request),
            )
            for planned, document in zip(plan.state.inputs, documents, strict=True):
                planned.text = document
        plan.state.extra = SurfaceOptions(
            top_n=request.top_n, return_documents=request.return_documents, output=kind
        )
        return plan

    def _rerank_prompt(self, request: RerankRequest) -> str:
        """The prompt a pair scorer's rerank request selects ("" for none): a LogitScore
        reranker's through its template, a cross-encoder's as CrossEncoder.predict resolves it."""
        if self.pair_template is not None:
            return self.pair_template.prompt_of(request)
        if self.pair_prompts is None:  # a head that scores pairs but no CrossEncoder reads
            refuse_prompt(request, self.info.name)
            return ""
        return self.pair_prompts.prompt_of(request, model=self.info.name)

    def _default_prompt(self) -> str:
        """The prompt a pair scorer's inputs get when the request names none ("" for none)."""
        if self.pair_template is not None:
            return self.pair_template.default_prompt()
        return self.pair_prompts.default_prompt() if self.pair_prompts is not None else ""

    def _refuse_ids(self, inputs: Sequence[str | list[int]]) -> None:
        if any(isinstance(i, list) for i in inputs):
            raise UnsupportedOption(  # the model's refusal: 422
                f"input: model {self.info.name!r} (PyLate ColBERT) encodes texts, with its prefix "
                "token; token ids are not served",
                param="input",
            )

    def _colbert_policy(self, options: Options, role: str) -> Overflow:
        """The long-input policy of a PyLate `role`: its budget is query_length or
        document_length (at most `options.max_tokens`), less the prefix token it inserts."""
        assert self.colbert is not None
        policy = self._policy(options)
        budget = min(policy.max_tokens, self.colbert.length(role))
        prefix = self.colbert.length(role) - self.colbert.budget(role)
        limit = ("less its prefix token, " if prefix else "") + f"a {role} of this model takes at most"
        return dataclasses.replace(policy, max_tokens=budget - prefix, limit=limit)

    def _colbert_rows(self, items: list[WorkItem], planned: Sequence[PlannedInput], role: str) -> None:
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

    def _plan_colbert_rerank(self, request: RerankRequest, head: HeadInfo, documents: list[str]) -> Plan:
        """MaxSim rerank of a PyLate package: the query encoded as a query, each document as
        a document, in one plan (the query's items first)."""
        output = self.outputs.engine_output(outputs.MULTI_VECTOR)
        query = self._plan(
            "rerank", head, request.options, [(request.query, None)], ["query"], output=output,
            policy=self._colbert_policy(request.options, pylate.QUERY),
        )
        params = [f"documents[{i}]" for i in range(len(documents))]
        plan = self._plan(
            "rerank", head, request.options, [(d, None) for d in documents], params, output=output,
            policy=self._colbert_policy(request.options, pylate.DOCUMENT),
        )
        self._colbert_rows(query.items, query.state.inputs, pylate.QUERY)
        self._colbert_rows(plan.items, plan.state.inputs, pylate.DOCUMENT)
        shift = len(query.items)
        for planned in plan.state.inputs:
            planned.items = [i + shift for i in planned.items]
        plan.items = query.items + plan.items
        plan.state.query = query.state.inputs[0]
        return plan

    def _head(self, surface: str, name: str | None, field: str = "options.head") -> HeadInfo:
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

    def _check_exit(self, request: RerankRequest) -> None:
        """A model here serves one pair-scorer exit (`info.rerank`): its last layer, at the width
        it scores from; a request naming another is the model's refusal (422) naming the field."""
        if self.info.rerank is None:
            return
        served = self.info.rerank.default
        if request.layer is not None and request.layer != served.layer:
            raise UnsupportedOption(
                f"layer: {request.layer} is not an exit of this model; it scores from its last layer, "
                f"{served.layer}",
                param="layer",
            )
        if request.dimensions is not None and request.dimensions != served.dimension:
            raise UnsupportedOption(
                f"dimensions: {request.dimensions} is not an exit of this model; it scores at dimension "
                f"{served.dimension}",
                param="dimensions",
            )

    def _budget(self, options: Options) -> tuple[int, str]:
        """The per-input token budget and whose it is: `options.max_tokens`, at most the model's."""
        if options.max_tokens is None:
            return self.max_tokens, "the model takes at most"
        if options.max_tokens > self.max_tokens:
            raise UnsupportedOption(
                f"options.max_tokens: {options.max_tokens} exceeds the model's limit of {self.max_tokens} tokens",
                param="options.max_tokens",
            )
        return options.max_tokens, "options.max_tokens allows at most"

    def _policy(self, options: Options) -> Overflow:
        mode = options.overflow_mode
        budget, limit = self._budget(options)
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

    def _output(self, head: HeadInfo, *, skip: int = 0) -> str:
        if head.kind == TOKEN:
            return "token_logits"
        if head.kind == POOLED:
            # Pooling that leaves out a prompt's tokens is done in finish, from the token states.
            return "hidden" if skip else self.pooling or "mean"
        return "logits"

    def _plan(
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
        encs = self._encode_bounded(pairs, options, params, prompt=prompt)
        return self._plan_encoded(surface, head, options, texts, encs, output=output, policy=policy)

    def _encode_bounded(
        self,
        pairs: Sequence[tuple[str, str | None]],
        options: Options,
        params: Sequence[str],
        *,
        prompt: str | None = None,
    ) -> list[Encoded]:
        """`pairs` tokenized within their character bound (windows.bound_chars): an input past it
        under `reject` is tokenized only up to it and marked clipped."""
        template, policy = self.pair_template, self._policy(options)
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

    def _plan_encoded(
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
        policy = policy or self._policy(options)
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

    def _item(self, enc: Encoded, piece: np.ndarray, output: str) -> WorkItem:
        key = f"task_heads/{output}"
        type_ids = None
        if self.uses_type_ids and enc.is_pair:
            types = enc.type_ids[piece]
            type_ids = types.tolist()
            key += "/types=" + _type_runs(types)
        return WorkItem(token_ids=enc.ids[piece].tolist(), type_ids=type_ids, output=output, key_extra=key)

    # Finishing ------------------------------------------------------------------------------

    def finish_surface(self, plan: Plan, results: Sequence[Result]) -> Any:
        # Never a fall-through to some surface's response: a plan this model did not make is a bug.
        if plan.surface not in ("classify", "embeddings", "rerank") or not isinstance(plan.state, PlanState):
            raise UnsupportedSurface(f"model {self.info.name!r} cannot finish a {plan.surface!r} plan")
        if len(results) != len(plan.items):
            raise ValueError(f"{len(results)} results for {len(plan.items)} work items")
        state = plan.state
        rows = [self._rows(planned, results, state.output) for planned in state.inputs]
        if plan.surface == "classify":
            return finish.classify(self, state, rows)
        if plan.surface == "embeddings":
            return finish.embeddings(self, state, rows)
        query = self._rows(state.query, results, state.output) if state.query is not None else None
        return finish.rerank(self, state, rows, query)

    def _rows(
        self, planned: PlannedInput, results: Sequence[Result], output: str
    ) -> list[np.ndarray] | ItemError:
        """One input's rows, or the error that answers it: its own, or its first failed item's."""
        if planned.split.error is not None:
            return planned.split.error
        rows: list[np.ndarray] = []
        for index, piece in zip(planned.items, planned.split.pieces, strict=True):
            result = results[index]
            if isinstance(result, ItemError):
                return result
            tokens = len(piece) if planned.role is None or self.colbert is None else (
                self.colbert.row_length(len(piece), planned.role)
            )
            expected = self._shape(output, tokens)
            if not _fits(tuple(result.shape), expected):
                return ItemError(
                    "invalid_model_output",
                    f"engine returned shape {tuple(result.shape)} for {output!r}, expected {expected}",
                )
            rows.append(result)
        return rows

    def _shape(self, output: str, tokens: int) -> tuple[int | None, ...]:
        """The shape a row of `output` has; None where any size is right (a sparse row's
        active ids, a projection's width)."""
        if output == "splade":
            return (None, 2)
        if output == "lexical":
            return (tokens,)
        if output == "colbert":
            return (tokens, None)
        if output == "logits":
            return (len(self.labels),)
        if output == "token_logits":
            return (tokens, len(self.labels))
        if output == "hidden":
            return (tokens, self.hidden_size)
        return (self.hidden_size,)

    def embedding_rows(
        self, state: PlanState, planned: PlannedInput, rows: list[np.ndarray], *, normalize: bool = True
    ) -> list[np.ndarray]:
        """One input's vectors, one per piece, as sentence-transformers' modules leave them:
        pooled (here, from token states, when a prompt is left out of pooling), then Dense and
        Normalize in the package's order."""
        if state.output == "hidden":
            rows = [
                pool_tokens(row, piece >= state.skip, self.pooling or "mean")
                for row, piece in zip(rows, planned.split.pieces, strict=True)
            ]
        return [self.post_pooling(row, final_normalize=normalize) for row in rows]

    def late_vectors(self, kind: str, planned: PlannedInput, row: np.ndarray) -> np.ndarray:
        """One input's multi-vector (or token) embedding from its one row: PyLate's for a
        ColBERT package's query or document, else as outputs.multi_vectors reads it."""
        if planned.role is not None and self.colbert is not None:
            ids = planned.enc.ids[planned.split.pieces[0]].tolist()
            return self.colbert.vectors(row, ids, planned.role)
        return outputs.multi_vectors(self.outputs, kind, row)
