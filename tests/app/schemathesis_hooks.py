"""schemathesis hooks for test_schemathesis.py (loaded through SCHEMATHESIS_HOOKS).

`positive_data_acceptance_with_rules` is schemathesis's own positive_data_acceptance, with the
statuses of the config's `[checks.positive_data_acceptance]` (no 400 among them), and one
exception: the rules below, which no JSON schema can state, are answered 400 with the error
that names them. Each is matched by its operations, its error code and its message (which
starts with the field it names), so any other 400 for a schema-valid request still fails the run.
"""

from __future__ import annotations

import json
import re
from typing import Any

import schemathesis
from schemathesis.specs.openapi.checks import positive_data_acceptance

# (operations, error code, its message: each starts with the field it names).
# The embeddings surface's OpenAI-shaped routes: its own, vLLM's and Infinity's.
EMBEDDINGS = "POST /v1/embeddings|POST /vllm/embeddings|POST /vllm/v1/embeddings|POST /embeddings|POST /infinity/embeddings"

RULES: list[tuple[str, str, re.Pattern[str]]] = [
    # Task ids unique within a bundle: JSON Schema's uniqueItems compares whole items, not one field.
    (
        "POST /v1/bundle",
        "invalid_request",
        re.compile(r"^tasks\[\d+\]\.id: .* is also the id of tasks\[\d+\]$"),
    ),
    # A job line's model, where it names one, is the job's: the two sit in different places (the
    # body's or the query's `model`, each line's), which no schema relates.
    (
        "POST /v1/jobs",
        "invalid_request",
        re.compile(r"^(requests item|line) \d+: model: .* differs from the job's model '[^']*'$"),
    ),
    # A job's lines are the routes' request bodies, one schema for both, but a job answers float
    # vectors: its lines refuse a quantized options.embedding_type, which JobRequest says in words.
    (
        "POST /v1/jobs",
        "invalid_request",
        re.compile(r"^(requests item|line) \d+: options\.embedding_type: jobs answer float vectors"),
    ),
    # `head` and its alias `options.head` both given and different: two fields' equality, which
    # JSON Schema has no word for.
    (
        "POST /v1/classify",
        "invalid_request",
        re.compile(r"^head: .* differs from options\.head .*; give one of them$"),
    ),
    # An input longer than the token budget: its length in tokens is the tokenizer's, which no
    # schema knows. OpenAI's and upstream's embeddings refuse it whole (400, naming the input;
    # upstream's item code for it is max_length_exceeded); with options.overflow given it is
    # answered in place instead.
    (
        EMBEDDINGS,
        "invalid_request",
        re.compile(r"^input(\[\d+\])?: input has (at least )?\d+ tokens; "),
    ),
    # The same on Cohere's embed with `truncate: NONE`: the request fails naming the text.
    (
        "POST /v1/embed|POST /v2/embed",
        "invalid_request",
        re.compile(r"^texts\[\d+\]: input has (at least )?\d+ tokens; "),
    ),
    # A prompt (prompt, prompt_name, input_type) with token-id input: token ids are taken as
    # given. One field's value against another's form, which only a conditional could state.
    (
        EMBEDDINGS,
        "invalid_request",
        re.compile(
            r"^(prompt|prompt_name|input_type): a prompt applies to texts; token ids are taken as given$"
        ),
    ),
    # Late chunking's document: its chunks are texts, none without tokens, the whole within the
    # token budget, read whole (no windows) and pooled dense; late_chunking and its alias
    # options.late_chunking agree. Lengths in tokens and one field's meaning for another's form,
    # which the document says in words (EmbeddingsRequest) and no schema can state.
    (
        EMBEDDINGS,
        "invalid_request",
        re.compile(
            r"^(input: the document \(its \d+ chunks joined[^)]*\) has \d+ (characters|tokens)"
            r"|input: late chunking takes the chunks as texts, not token ids$"
            r"|input(\[\d+\])?: a chunk without tokens has no vector to pool$"
            r"|options\.overflow: late chunking encodes the document whole"
            r"|options\.output: late chunking pools dense vectors"
            r"|late_chunking: (true|false) differs from options\.late_chunking (true|false); give one of them$)"
        ),
    ),
    # Windows with multi_vector rerank: options.overflow against options.output, likewise.
    (
        "POST /v1/rerank",
        "invalid_request",
        re.compile(r"^options\.overflow: 'window' does not apply to multi_vector rerank$"),
    ),
    # vLLM's score: text_1 is one text or as many as text_2, an equality of two lengths that
    # JSON Schema has no word for.
    (
        "POST /score|POST /v1/score|POST /vllm/score|POST /vllm/v1/score",
        "invalid_request",
        re.compile(r"^text_2: \d+ texts for \d+ in text_1; give one text_1, or as many as text_2$"),
    ),
    # vLLM's embeddings fields beside the options they stand for (truncate_prompt_tokens and
    # options.overflow or max_tokens, normalize and options.normalize): one setting given twice
    # across two objects, which no schema relates.
    (
        "POST /vllm/embeddings|POST /vllm/v1/embeddings",
        "invalid_request",
        re.compile(
            r"^(truncate_prompt_tokens: give it or options\.overflow/options\.max_tokens, not both"
            r"|normalize: differs from options\.normalize)$"
        ),
    ),
    # A field that shapes a dense vector (dimensions, layer, normalize, base64, windows), given
    # with another options.output: one field's meaning hangs on a field of another object, which
    # the document says in words (options.output) and a schema could say only by a conditional
    # across the two objects.
    (
        EMBEDDINGS,
        "invalid_request",
        re.compile(
            r"^(dimensions|layer|options\.normalize|options\.embedding_type|encoding_format|options\.overflow): "
            r"applies to "
            r"dense output only, not options\.output '[a-z_]+'$"
        ),
    ),
]


def _error(response: Any) -> dict[str, Any]:
    try:
        body = json.loads(response.content)
    except (ValueError, UnicodeDecodeError):
        return {}
    error = body.get("error") if isinstance(body, dict) else None
    return error if isinstance(error, dict) else {}


def named_rule(operation: str, response: Any) -> bool:
    """Whether `response` is the 400 of one of RULES for `operation` (`labels`: "|" between)."""
    if response.status_code != 400:
        return False
    error = _error(response)
    message = error.get("message")
    return any(
        operation in labels.split("|")
        and error.get("code") == code
        and isinstance(message, str)
        and pattern.search(message)
        for labels, code, pattern in RULES
    )


@schemathesis.check
def positive_data_acceptance_with_rules(ctx: Any, response: Any, case: Any) -> bool | None:
    if named_rule(case.operation.label, response):
        return None
    return positive_data_acceptance(ctx, response, case)  # type: ignore[no-any-return]
