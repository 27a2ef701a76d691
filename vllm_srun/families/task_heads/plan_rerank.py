"""Plans a rerank request: a pair scorer's (query, document) pairs, a bi-encoder's query and
documents as embeddings, or a PyLate package's query and documents for MaxSim."""

from __future__ import annotations

from vllm_srun.errors import InvalidRequest
from vllm_srun.families.task_heads import colbert as pylate
from vllm_srun.families.task_heads import outputs
from vllm_srun.families.task_heads.base import TaskHeadsBase
from vllm_srun.families.task_heads.cross_encoder import refuse_prompt
from vllm_srun.families.task_heads.heads import POOLED
from vllm_srun.families.task_heads.plan_state import SurfaceOptions
from vllm_srun.families.task_heads.windows import bound_chars
from vllm_srun.plugins.base import HeadInfo, Plan
from vllm_srun.plugins.bodies import UnsupportedOption
from vllm_srun.plugins.surfaces import RerankDocument, RerankRequest


def plan_rerank(model: TaskHeadsBase, request: RerankRequest) -> Plan:
    head = model.head("rerank", request.options.head)
    _check_exit(model, request)
    if head.kind == POOLED:
        refuse_prompt(request, model.info.name)
    documents = [d.text if isinstance(d, RerankDocument) else d for d in request.documents]
    if not documents:
        raise InvalidRequest("documents: must not be empty")
    kind = request.options.output or (outputs.DENSE if model.outputs.dense else outputs.MULTI_VECTOR)
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
        model.outputs.check(kind, model=model.info.name)
    if kind == outputs.DENSE and head.kind == POOLED:
        model.outputs.check(kind, model=model.info.name)  # a PyLate package pools nothing
    if kind == outputs.MULTI_VECTOR and model.colbert is not None:
        plan = _plan_colbert(model, request, head, documents)
    elif head.kind == POOLED:
        # Bi-encoder: the query is embedded once, as an extra input planned first.
        params = ["query"] + [f"documents[{i}]" for i in range(len(documents))]
        pairs: list[tuple[str, str | None]] = [(request.query, None), *((d, None) for d in documents)]
        output = model.outputs.engine_output(kind) if kind != outputs.DENSE else None
        plan = model.plan_pairs("rerank", head, request.options, pairs, params, output=output)
        plan.state.query = plan.state.inputs.pop(0)
    else:
        bound_chars([len(request.query)], model.policy(request.options), ["query"])
        params = [f"documents[{i}]" for i in range(len(documents))]
        plan = model.plan_pairs(
            "rerank", head, request.options, [(request.query, d) for d in documents], params,
            prompt=_prompt(model, request),
        )
        for planned, document in zip(plan.state.inputs, documents, strict=True):
            planned.text = document
    plan.state.extra = SurfaceOptions(
        top_n=request.top_n, return_documents=request.return_documents, output=kind
    )
    return plan


def _check_exit(model: TaskHeadsBase, request: RerankRequest) -> None:
    """A model here serves one pair-scorer exit (`info.rerank`): its last layer, at the width
    it scores from; a request naming another is the model's refusal (422) naming the field."""
    if model.info.rerank is None:
        return
    served = model.info.rerank.default
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


def _prompt(model: TaskHeadsBase, request: RerankRequest) -> str:
    """The prompt a pair scorer's rerank request selects ("" for none): a LogitScore
    reranker's through its template, a cross-encoder's as CrossEncoder.predict resolves it."""
    if model.pair_template is not None:
        return model.pair_template.prompt_of(request)
    if model.pair_prompts is None:  # a head that scores pairs but no CrossEncoder reads
        refuse_prompt(request, model.info.name)
        return ""
    return model.pair_prompts.prompt_of(request, model=model.info.name)


def _plan_colbert(model: TaskHeadsBase, request: RerankRequest, head: HeadInfo, documents: list[str]) -> Plan:
    """MaxSim rerank of a PyLate package: the query encoded as a query, each document as
    a document, in one plan (the query's items first)."""
    output = model.outputs.engine_output(outputs.MULTI_VECTOR)
    query = model.plan_pairs(
        "rerank", head, request.options, [(request.query, None)], ["query"], output=output,
        policy=model.colbert_policy(request.options, pylate.QUERY),
    )
    params = [f"documents[{i}]" for i in range(len(documents))]
    plan = model.plan_pairs(
        "rerank", head, request.options, [(d, None) for d in documents], params, output=output,
        policy=model.colbert_policy(request.options, pylate.DOCUMENT),
    )
    model.colbert_rows(query.items, query.state.inputs, pylate.QUERY)
    model.colbert_rows(plan.items, plan.state.inputs, pylate.DOCUMENT)
    shift = len(query.items)
    for planned in plan.state.inputs:
        planned.items = [i + shift for i in planned.items]
    plan.items = query.items + plan.items
    plan.state.query = query.state.inputs[0]
    return plan
