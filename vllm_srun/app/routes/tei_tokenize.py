"""POST /tokenize and POST /decode (text-embeddings-inference), with the served model's own
tokenizer: the one it plans with, padding and truncation off.

A token is `{id, text, special, start, stop}`: a special token has no offsets; any other has
its text cut from the input by its offsets (code points). A model without a tokenizer (one a
plugin serves some other way) is refused as TEI refuses what its model cannot do (424). With
`prompt_name` the package's prompt is put in front of each input, as TEI does, and the offsets
are into that whole text.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import msgspec
from litestar import Request, post
from litestar.params import JSONBody
from tokenizers import Tokenizer

from vllm_srun.app.routes.tei_shared import NON_EMPTY_LIST, TEI_ERRORS, TeiError, check_batch, model_for
from vllm_srun.app.serving import THREAD_PLAN_CHARS, THREAD_PLAN_INPUTS
from vllm_srun.plugins.base import LoadedModel


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
