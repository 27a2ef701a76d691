"""Request bodies decoded as strictly as the document describes them.

Litestar converts a handler's `data` with msgspec's `strict=False`, which takes "4" for an
integer and 0 or "true" for a boolean: values the document (generated from the same types)
says are not of that type. OpenAI's and TEI's servers refuse them too. This hook decodes the
body with `strict=True` into the handler's own body type before Litestar does, so a body the
document refuses is refused here with the same error Litestar's decoding gives (a 400, TEI's
422 on the TEI-shaped routes); one it accepts decodes to the same value both ways.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import msgspec
from litestar import Request
from litestar.exceptions import ValidationException
from litestar.handlers import HTTPRouteHandler

from vllm_srun.plugins.surfaces import whole_numbers


@cache
def _decoder(handler: HTTPRouteHandler) -> msgspec.json.Decoder[Any] | None:
    """A strict decoder of `handler`'s JSON body type; None for a handler without a typed
    `data` body (its body is raw bytes, a string, or not read)."""
    parameter = handler.parsed_fn_signature.parameters.get("data")
    if parameter is None or parameter.annotation in (bytes, str, Any):
        return None
    return msgspec.json.Decoder(parameter.annotation, strict=True)


def _refusal(exc: msgspec.ValidationError) -> ValidationException:
    """msgspec's "Expected `bool`, got `int` - at `$.truncate`" as Litestar reports a body's
    field (`{"key": "truncate", "message": ...}`), so the app's one handler words both alike."""
    message, _, where = str(exc).partition(" - at `")
    key = where.rstrip("`")
    # The body itself is Litestar's "data" (the app's handler says "body"), a field its path.
    key = key[2:] if key.startswith("$.") else key or "data"
    if key != "data" and message.startswith("Object contains unknown field `"):
        key = f"{key}.{message.split('`')[1]}"  # the option named, as OpenAI's `param` would
    entry = {"message": message, "key": key, "source": "body"}
    return ValidationException(detail=f"Validation failed for {exc}", extra=[entry])


async def strict_body(request: Request[Any, Any, Any]) -> None:
    """Refuse a JSON body that decodes only leniently (a Litestar `before_request` hook)."""
    handler = request.scope["route_handler"]
    if request.method != "POST" or not isinstance(handler, HTTPRouteHandler):
        return
    decoder = _decoder(handler)
    media_type = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if decoder is None or media_type != "application/json":
        return  # a JSONL job, say: decoded line by line, as strictly (Surface.decode)
    body = await request.body()
    if not body:
        return  # Litestar answers a missing body itself
    try:
        decoder.decode(body)
    except msgspec.ValidationError as exc:
        # JSON Schema's integer is a number without a fraction, so 2.0 is one; msgspec's strict
        # integer is not. Only a body refused can hold one: read it again with those as ints.
        try:
            msgspec.convert(whole_numbers(msgspec.json.decode(body)), type=decoder.type, strict=True)
        except msgspec.ValidationError:
            raise _refusal(exc) from None
        except msgspec.DecodeError:
            return  # typed wrongly before it is malformed ("0 junk"): Litestar answers the JSON
    except msgspec.DecodeError:
        return  # malformed JSON: Litestar's decoding answers it as it always has
