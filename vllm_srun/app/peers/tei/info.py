"""The served model as TEI exposes it: GET /info (the model and the server's bounds, in TEI's
fields, which TEI clients read to size their batches), and POST /tokenize and /decode with the
model's own tokenizer, padding and truncation off. A model's TEI kind follows its default head:
a pooled head is an `embedding` model, a one-label sequence head a `reranker`, any other
sequence head a `classifier`.
"""

from __future__ import annotations

import asyncio
import os
from typing import Annotated, Any, Literal

import msgspec
from litestar import Request, get, post
from litestar.params import JSONBody
from tokenizers import Tokenizer

from vllm_srun import __version__, defaults
from vllm_srun.app.peers.tei.errors import TEI_ERRORS, TeiError
from vllm_srun.app.peers.tei.requests import NON_EMPTY_LIST, check_batch, model_for
from vllm_srun.app.runtime import Runtime
from vllm_srun.app.serving import THREAD_PLAN_CHARS, THREAD_PLAN_INPUTS
from vllm_srun.plugins.base import LoadedModel

Kind = Literal["embedding", "classifier", "reranker"]


def kind_of(model: LoadedModel) -> Kind:
    """The TEI kind of `model`; a model TEI has no kind for is refused (424)."""
    info = model.info
    head = info.heads[0] if info.heads else None
    if head is not None and head.kind in ("pooled", "sparse") and "embeddings" in info.surfaces:
        return "embedding"  # a SPLADE model is TEI's embedding model with splade pooling
    if head is not None and "classify" in info.surfaces and head.kind in ("sequence", "scores", "relevance"):
        return "reranker" if head.kind == "relevance" else "classifier"
    raise TeiError("backend", f"model {info.name!r} is not an embedding, classifier or reranker model")


class Info(msgspec.Struct):
    model_id: str
    model_sha: str | None
    model_dtype: str
    model_type: dict[str, dict[str, Any]]
    max_concurrent_requests: int
    max_input_length: int
    max_batch_tokens: int
    max_batch_requests: int | None
    max_client_batch_size: int
    auto_truncate: bool
    tokenization_workers: int
    version: str
    sha: str | None = None
    docker_label: str | None = None


def _model_type(model: LoadedModel, kind: Kind) -> dict[str, dict[str, Any]]:
    info = model.info
    if kind == "embedding":
        pooling = info.embedding.pooling if info.embedding else "mean"
        return {kind: {"pooling": "splade" if info.heads[0].kind == "sparse" else pooling}}
    labels = info.heads[0].labels or []
    return {
        kind: {
            "id2label": {str(i): label for i, label in enumerate(labels)},
            "label2id": {label: i for i, label in enumerate(labels)},
        }
    }


@get("/info", summary="The served model (TEI-compatible)", exception_handlers=TEI_ERRORS)
async def info(request: Request[Any, Any, Any]) -> Info:
    runtime: Runtime = request.app.state.runtime
    name, model = model_for(runtime, None)
    served = runtime.models[name]
    settings = runtime.settings
    return Info(
        model_id=name,
        model_sha=model.info.model_sha256,
        model_dtype=served.placement.dtype if served.placement else model.info.numerics,
        model_type=_model_type(model, kind_of(model)),
        max_concurrent_requests=settings.max_queued_items,
        max_input_length=model.info.max_tokens or defaults.FALLBACK_MAX_TOKENS,
        max_batch_tokens=served.limits.max_num_batched_tokens,
        max_batch_requests=served.limits.max_num_seqs,
        max_client_batch_size=settings.max_inputs,
        auto_truncate=settings.auto_truncate,
        # The tokenizers library encodes a batch on one thread per core.
        tokenization_workers=os.cpu_count() or 1,
        version=__version__,
    )


class TokenizeRequest(msgspec.Struct, forbid_unknown_fields=True):
    """TEI's /tokenize body."""

    inputs: str | Annotated[list[str], NON_EMPTY_LIST]
    add_special_tokens: bool = True
    prompt_name: str | None = None


class SimpleToken(msgspec.Struct):
    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


class DecodeRequest(msgspec.Struct, forbid_unknown_fields=True):
    """TEI's /decode body: one list of ids, or a batch of them."""

    ids: Annotated[list[Any], NON_EMPTY_LIST]
    skip_special_tokens: bool = True


def model_of(request: Request[Any, Any, Any]) -> tuple[LoadedModel, Tokenizer]:
    """The model these routes reach and its tokenizer, if it has one to expose."""
    name, model = model_for(request.app.state.runtime, None)
    tokenizer = model.tokenizer()
    if tokenizer is None:
        raise TeiError("backend", f"model {name!r} ({model.info.family}) has no tokenizer to expose")
    return model, tokenizer


def prompt_of(model: LoadedModel, name: str | None) -> str:
    """The text of the package's prompt `name` (TEI prepends it to each input), "" for none."""
    if name is None:
        return ""
    prompts = model.prompts()
    if name not in prompts:
        known = ", ".join(repr(p) for p in prompts) or "none"
        raise TeiError(
            "validation", f"prompt_name: no prompt named {name!r}; its prompts: {known}", status=422
        )
    return prompts[name]


def _tokens(tokenizer: Tokenizer, text: str, add_special_tokens: bool) -> list[SimpleToken]:
    enc = tokenizer.encode(text, add_special_tokens=add_special_tokens)
    out = []
    for token_id, token, special, (start, stop) in zip(
        enc.ids, enc.tokens, enc.special_tokens_mask, enc.offsets, strict=True
    ):
        if special:
            out.append(SimpleToken(id=token_id, text=token, special=True, start=None, stop=None))
        else:
            out.append(SimpleToken(id=token_id, text=text[start:stop], special=False, start=start, stop=stop))
    return out


@post("/tokenize", status_code=200, summary="Tokenize texts (TEI-compatible)", exception_handlers=TEI_ERRORS)
async def tokenize(
    request: Request[Any, Any, Any], data: JSONBody[TokenizeRequest]
) -> list[list[SimpleToken]]:
    texts = [data.inputs] if isinstance(data.inputs, str) else data.inputs
    check_batch(request.app.state.runtime, len(texts), "inputs")
    model, tokenizer = model_of(request)
    prompt = prompt_of(model, data.prompt_name)

    def run() -> list[list[SimpleToken]]:
        return [_tokens(tokenizer, prompt + text, data.add_special_tokens) for text in texts]

    # As planning does: a large batch is tokenised off the event loop, so small requests go on.
    if len(texts) > THREAD_PLAN_INPUTS or sum(map(len, texts)) > THREAD_PLAN_CHARS:
        return await asyncio.to_thread(run)
    return run()


def _id_lists(ids: list[Any]) -> list[list[int]]:
    if not ids:  # documented (minItems), and answered as TEI answers an empty batch
        raise TeiError("empty", "`ids` cannot be empty")
    batch = ids if isinstance(ids[0], list) else [ids]
    for i, one in enumerate(batch):
        if not isinstance(one, list) or not all(isinstance(v, int) and v >= 0 for v in one):
            raise TeiError("validation", f"ids[{i}]: expected a list of token ids", status=422)
    return batch


@post("/decode", status_code=200, summary="Decode token ids (TEI-compatible)", exception_handlers=TEI_ERRORS)
async def decode(request: Request[Any, Any, Any], data: JSONBody[DecodeRequest]) -> list[str]:
    batch = _id_lists(data.ids)
    check_batch(request.app.state.runtime, len(batch), "ids")
    _, tokenizer = model_of(request)
    vocabulary = tokenizer.get_vocab_size(with_added_tokens=True)
    for i, one in enumerate(batch):
        unknown = next((v for v in one if v >= vocabulary), None)
        if unknown is not None:
            raise TeiError("validation", f"ids[{i}]: {unknown} is not in the model's vocabulary", status=422)
    return [tokenizer.decode(one, skip_special_tokens=data.skip_special_tokens) for one in batch]
