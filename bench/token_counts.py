"""One text at a time at token counts a fresh server has not seen, then at the same counts again.

A CPU engine may build kernels (oneDNN primitives, compiled graphs) for each input shape the
first time it meets it; a single caller pays that on the request. Right after start-up, before
any other traffic but a few settling requests, each count in LENGTHS gets a text of exactly that
many tokens (special tokens included, by the model's own tokenizer), then a second, different
text of the same count: the first is `unseen`, the second `seen`. Every text is new, so a result
cache never answers it.
"""

from __future__ import annotations

import random
import statistics
from pathlib import Path
from typing import Any

from bench import shapes
from vllm_srun.registry.corpus import WORDS

# Counts no settling request has, spread over the corpus's range, none on a multiple of 8.
LENGTHS = tuple(range(13, 110, 8))
SETTLE_LENGTH = 7
SETTLE_REQUESTS = 3


def tokenizer(model: str) -> Any:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(model) / "tokenizer.json"))
    tok.no_padding()  # MiniLM's file pads every text to 128: a count is the text's own
    return tok


def text_of(tok: Any, tokens: int, rng: random.Random) -> str:
    """A text the tokenizer turns into exactly `tokens` ids (special tokens counted)."""
    words: list[str] = []
    for _ in range(tokens * 20):
        count = len(tok.encode(" ".join(words)).ids)
        if count == tokens:
            return " ".join(words)
        word = rng.choice(WORDS)
        if len(tok.encode(" ".join([*words, word])).ids) <= tokens:
            words.append(word)
    raise ValueError(f"no text of {tokens} tokens from the corpus's words")


async def probe(url: str, model: str, *, path: str, encoding: str = "float", seed: int = 0) -> dict[str, Any]:
    """p50 (and each figure) of one-text requests at unseen token counts and at seen ones."""
    tok, rng = tokenizer(model), random.Random(seed)
    unseen, seen, settle = shapes.Outcome(), shapes.Outcome(), shapes.Outcome()
    async with shapes.http_client(url) as client:
        for _ in range(SETTLE_REQUESTS):
            await shapes.embed(client, [text_of(tok, SETTLE_LENGTH, rng)], encoding, settle, path=path)
        for tokens in LENGTHS:
            await shapes.embed(client, [text_of(tok, tokens, rng)], encoding, unseen, path=path)
            await shapes.embed(client, [text_of(tok, tokens, rng)], encoding, seen, path=path)
    out: dict[str, Any] = {"lengths": list(LENGTHS)}
    for name, got in (("unseen", unseen), ("seen", seen)):
        ms = [round(s * 1000, 2) for s in got.latencies_s]
        out[f"{name}_ms"] = ms
        out[f"{name}_p50_ms"] = statistics.median(ms) if ms else None
        if got.errors:
            out[f"{name}_first_error"] = got.first_error
    return out
