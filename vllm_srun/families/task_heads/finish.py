"""Responses from raw rows: one function per surface. An input whose rows are an `ItemError`
is answered with that error in its own `error` field; its siblings are answered as usual."""

from __future__ import annotations

import base64

import numpy as np

from vllm_srun.families.task_heads import heads, late_chunking, outputs
from vllm_srun.families.task_heads.base import TaskHeadsBase
from vllm_srun.families.task_heads.plan_state import PlannedInput, PlanState
from vllm_srun.families.task_heads.spans import token_readout
from vllm_srun.plugins.base import ItemError
from vllm_srun.plugins.bodies import Representation, ResponseMeta, item_error_code, served_profile
from vllm_srun.plugins.surfaces import (
    ClassifyKind,
    ClassifyResponse,
    ClassifyResult,
    ClassifyWindow,
    Embedding,
    EmbeddingsResponse,
    EmbeddingsUsage,
    InputUsage,
    RerankResponse,
    RerankResult,
    SparseEmbedding,
    Usage,
)

Rows = list[np.ndarray] | ItemError

# Upstream's classify kinds: a relevance head answers label scores, one per label.
KINDS: dict[str, ClassifyKind] = {
    heads.SEQUENCE: "sequence",
    heads.SCORES: "scores",
    heads.TOKEN: "token",
    heads.RELEVANCE: "scores",
}


def _fail(item: ClassifyResult | Embedding | RerankResult, error: ItemError) -> None:
    item.error, item.message = item_error_code(error.code), error.message


def _tokens(inputs: list[PlannedInput]) -> int:
    return sum(p.split.info.processed_tokens for p in inputs)


def _meta(model: TaskHeadsBase, state: PlanState) -> ResponseMeta | None:
    if not state.options.return_meta:
        return None
    info = model.info
    return ResponseMeta(
        model_id=info.name,
        model_sha256=info.model_sha256,
        profile=served_profile(info.numerics),
        numerics=info.numerics,
        head=state.head.name,
    )


def _relevance_scores(score: float, labels: int) -> list[float]:
    """A relevance score as one score per label: a two-label model's is its last label's
    softmax probability, so the first label has the rest."""
    return [score] if labels == 1 else [1.0 - score, score]


def _windows(head: str, planned: PlannedInput, rows: list[np.ndarray], labels: int) -> list[ClassifyWindow]:
    """Each window's own reading, for an input read under the window policy."""
    assert planned.split.windows is not None
    out: list[ClassifyWindow] = []
    for (start, end), row in zip(planned.split.windows, rows, strict=True):
        window = ClassifyWindow(start=start, end=end)
        if head == heads.SEQUENCE:
            window.probabilities = heads.softmax(row.astype(np.float64)).tolist()
        elif head == heads.SCORES:
            window.scores = heads.sigmoid(row.astype(np.float64)).tolist()
        elif head == heads.RELEVANCE:
            window.scores = _relevance_scores(heads.relevance([row]).score, labels)
        out.append(window)
    return out


def classify(model: TaskHeadsBase, state: PlanState, all_rows: list[Rows]) -> ClassifyResponse:
    head, options, labels = state.head, state.options, model.labels
    results: list[ClassifyResult] = []
    for index, (planned, rows) in enumerate(zip(state.inputs, all_rows, strict=True)):
        result = ClassifyResult(index=index, input=planned.split.info)
        if isinstance(rows, ItemError):
            _fail(result, rows)
            results.append(result)
            continue
        if planned.split.windows is not None:
            result.windows = _windows(head.kind, planned, rows, len(labels))
        if head.kind == heads.TOKEN:
            result.spans, result.tokens = token_readout(
                planned.text,
                planned.enc,
                planned.split.pieces,
                rows,
                labels,
                threshold=options.threshold,
                return_tokens=options.return_tokens,
            )
        elif head.kind == heads.RELEVANCE:
            relevance = heads.relevance(rows)
            result.label, result.score = labels[-1], relevance.score
            result.scores = _relevance_scores(relevance.score, len(labels))
            if options.return_logits:
                result.logits = [relevance.logit]
        else:
            logits = heads.max_logits(rows)
            probs = heads.sigmoid(logits) if head.kind == heads.SCORES else heads.softmax(logits)
            best = int(probs.argmax())
            result.label, result.score = labels[best], float(probs[best])
            if options.return_logits:
                result.logits = logits.tolist()
            if head.kind == heads.SCORES:
                result.scores = probs.tolist()
                threshold = options.threshold if options.threshold is not None else heads.DEFAULT_THRESHOLD
                result.selected = [label for label, p in zip(labels, probs, strict=True) if p >= threshold]
            else:
                result.probabilities = probs.tolist()
        results.append(result)
    return ClassifyResponse(
        model=model.info.name,
        head=head.name,
        kind=KINDS[head.kind],
        labels=list(labels),
        results=results,
        usage=Usage(input_tokens=_tokens(state.inputs), output_tokens=0),
        meta=_meta(model, state),
    )


def _other_output(
    model: TaskHeadsBase, state: PlanState, item: Embedding, planned: PlannedInput, rows: list[np.ndarray]
) -> None:
    """A non-dense embedding (outputs.py) of one input read as one piece, in its own field."""
    kind = state.extra.get("output", outputs.DENSE)
    (row,) = rows
    if kind == outputs.SPARSE:
        indices, values = outputs.sparse(model.outputs, row, planned.enc.ids[planned.split.pieces[0]])
        item.sparse_embedding = SparseEmbedding(indices=indices, values=values)
    else:
        item.token_embeddings = late_vectors(model, kind, planned, row).tolist()


def embeddings(model: TaskHeadsBase, state: PlanState, all_rows: list[Rows]) -> EmbeddingsResponse:
    if state.extra.get("output", outputs.DENSE) != outputs.DENSE:
        return _other_embeddings(model, state, all_rows)
    dimensions: int | None = state.extra.get("dimensions")
    as_base64 = state.extra.get("encoding_format") == "base64"
    data: list[Embedding] = []
    dimension = model.info.embedding.dimension if model.info.embedding else 0
    normalize = model.normalize if state.options.normalize is None else state.options.normalize
    for index, (info, rows) in enumerate(_dense_inputs(model, state, all_rows, normalize=normalize)):
        item = Embedding(index=index, object="embedding", input=info)
        if isinstance(rows, ItemError):
            _fail(item, rows)
        else:
            vector = heads.pooled(rows, normalize=normalize, dimensions=dimensions)
            dimension = int(vector.shape[0])
            # OpenAI's base64 format: the float32 little-endian bytes of the vector.
            item.embedding = (
                base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
                if as_base64
                else vector.tolist()
            )
        data.append(item)
    tokens = _tokens(state.inputs)
    usage = EmbeddingsUsage(prompt_tokens=tokens, total_tokens=tokens)
    response = EmbeddingsResponse(data=data, model=model.info.name, usage=usage, object="list")
    meta = _meta(model, state)
    if meta is not None:
        meta.representation = Representation(
            model_sha256=model.info.model_sha256,
            layer=state.extra.get("layer") or model.num_layers,
            dimension=dimensions or dimension,
            normalized=normalize,
            modality="text",
        )
        response.meta = meta
    return response


def _dense_inputs(
    model: TaskHeadsBase, state: PlanState, all_rows: list[Rows], *, normalize: bool
) -> list[tuple[InputUsage, Rows]]:
    """Each answer's input usage and vectors (one per piece), or its error: one answer per
    input, or under late chunking one per chunk of the one document."""
    if state.chunks is not None:
        (rows,) = all_rows
        usage = late_chunking.chunk_usage(state.chunks)
        if isinstance(rows, ItemError):
            return [(info, rows) for info in usage]
        vectors = late_chunking.chunk_vectors(model, state.chunks, rows[0], normalize=normalize)
        return [(info, [vector]) for info, vector in zip(usage, vectors, strict=True)]
    answers: list[tuple[InputUsage, Rows]] = []
    for planned, rows in zip(state.inputs, all_rows, strict=True):
        if not isinstance(rows, ItemError):
            rows = embedding_rows(model, state, planned, rows, normalize=normalize)
        answers.append((planned.split.info, rows))
    return answers


def _other_embeddings(model: TaskHeadsBase, state: PlanState, all_rows: list[Rows]) -> EmbeddingsResponse:
    data: list[Embedding] = []
    for index, (planned, rows) in enumerate(zip(state.inputs, all_rows, strict=True)):
        item = Embedding(index=index, object="embedding", input=planned.split.info)
        if isinstance(rows, ItemError):
            _fail(item, rows)
        else:
            _other_output(model, state, item, planned, rows)
        data.append(item)
    tokens = _tokens(state.inputs)
    usage = EmbeddingsUsage(prompt_tokens=tokens, total_tokens=tokens)
    return EmbeddingsResponse(
        data=data, model=model.info.name, usage=usage, object="list", meta=_meta(model, state)
    )


def rerank(
    model: TaskHeadsBase, state: PlanState, all_rows: list[Rows], query: Rows | None
) -> RerankResponse:
    scored: list[tuple[float, RerankResult]] = []
    failed: list[RerankResult] = []
    query_vector = None
    late = state.extra.get("output") == outputs.MULTI_VECTOR
    query_vectors = (
        late_vectors(model, outputs.MULTI_VECTOR, state.query, query[0])
        if late and isinstance(query, list) and state.query is not None
        else None
    )
    if isinstance(query, list) and not late:
        # Cosine of the embeddings, whatever the model's own normalisation.
        assert state.query is not None
        vectors = embedding_rows(model, state, state.query, query)
        query_vector = _unit(heads.pooled(vectors, normalize=True, dimensions=None))
    for index, (planned, rows) in enumerate(zip(state.inputs, all_rows, strict=True)):
        result = RerankResult(index=index, input=planned.split.info)
        if state.extra.get("return_documents"):
            result.document = planned.text
        error = query if isinstance(query, ItemError) else rows if isinstance(rows, ItemError) else None
        if error is not None:
            _fail(result, error)
            failed.append(result)
            continue
        assert isinstance(rows, list)
        if query_vectors is not None:
            document_vectors = late_vectors(model, outputs.MULTI_VECTOR, planned, rows[0])
            result.relevance_score = result.logit = outputs.maxsim(query_vectors, document_vectors)
        elif query_vector is not None:
            vectors = embedding_rows(model, state, planned, rows)
            vector = _unit(heads.pooled(vectors, normalize=True, dimensions=None))
            # A bi-encoder's logit is the score it ranks by: the cosine.
            result.relevance_score = result.logit = float(np.dot(query_vector, vector))
        else:
            relevance = heads.relevance(rows)
            result.relevance_score, result.logit = relevance.score, relevance.logit
        scored.append((result.relevance_score, result))
    # Stable sort: equal scores keep document order. Failed documents come last.
    ordered = [r for _, r in sorted(scored, key=lambda pair: -pair[0])] + failed
    top_n = state.extra.get("top_n")
    if top_n is not None:
        ordered = ordered[:top_n]
    tokens = _tokens(state.inputs + ([state.query] if state.query is not None else []))
    usage = Usage(input_tokens=tokens, output_tokens=0, prompt_tokens=tokens, total_tokens=tokens)
    return RerankResponse(model=model.info.name, results=ordered, usage=usage, meta=_meta(model, state))


def embedding_rows(
    model: TaskHeadsBase, state: PlanState, planned: PlannedInput, rows: list[np.ndarray], *, normalize: bool = True
) -> list[np.ndarray]:
    """One input's vectors, one per piece, as sentence-transformers' modules leave them:
    pooled (here, from token states, when a prompt is left out of pooling), then Dense and
    Normalize in the package's order."""
    if state.output == "hidden":
        rows = [
            heads.pool_tokens(row, piece >= state.skip, model.pooling or "mean")
            for row, piece in zip(rows, planned.split.pieces, strict=True)
        ]
    return [model.post_pooling(row, final_normalize=normalize) for row in rows]


def late_vectors(model: TaskHeadsBase, kind: str, planned: PlannedInput, row: np.ndarray) -> np.ndarray:
    """One input's multi-vector (or token) embedding from its one row: PyLate's for a
    ColBERT package's query or document, else as outputs.multi_vectors reads it."""
    if planned.role is not None and model.colbert is not None:
        ids = planned.enc.ids[planned.split.pieces[0]].tolist()
        return model.colbert.vectors(row, ids, planned.role)
    return outputs.multi_vectors(model.outputs, kind, row)


def _unit(v: np.ndarray) -> np.ndarray:
    v64 = v.astype(np.float64)
    norm = float(np.linalg.norm(v64))
    out: np.ndarray = v64 / norm if norm > 0 else v64
    return out
