"""Tokenization: the package's tokenizer.json, with its own padding and truncation turned off.

Packages often ship a tokenizer.json that pads or truncates (all-MiniLM-L6-v2 does both at
128); the family decides about long inputs itself (see `windows.py`) and the engine pads per
batch, so both are disabled. Special tokens come from the tokenizer's post-processor, so
[CLS]/[SEP] (or <s>, <bos>...) are placed exactly as the model was trained.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tokenizers import Encoding, Tokenizer, normalizers

from vllm_srun.errors import PackageError

# Up to this many inputs, of at most this many characters in all, are encoded on the calling
# thread, not the tokenizer's thread pool.
_SERIAL_INPUTS = 4
_SERIAL_CHARS = 4096
# Position kinds in `Encoded.seq`: a token of the first text, of the second, or a special token.
FIRST, SECOND, SPECIAL = 0, 1, -1


@dataclass(frozen=True, eq=False)
class Encoded:
    """One input, tokenized with special tokens. Offsets are code points into its own text."""

    ids: np.ndarray  # int64 [n]
    type_ids: np.ndarray  # int64 [n]
    offsets: np.ndarray  # int64 [n, 2], end exclusive; (0, 0) for special tokens
    seq: np.ndarray  # int8 [n]: FIRST, SECOND or SPECIAL
    words: np.ndarray  # int64 [n]: word index within its text, -1 when the tokenizer gives none
    tokens: list[str]
    is_pair: bool
    # Only a prefix of the text was tokenized (windows.bound_chars): its tokens are a lower bound.
    clipped: bool = False

    def __len__(self) -> int:
        return int(self.ids.shape[0])


def _encoded(enc: Encoding, is_pair: bool) -> Encoded:
    n = len(enc.ids)
    return Encoded(
        ids=np.asarray(enc.ids, dtype=np.int64),
        type_ids=np.asarray(enc.type_ids, dtype=np.int64),
        offsets=np.asarray(enc.offsets, dtype=np.int64).reshape(n, 2),
        seq=np.asarray([SPECIAL if s is None else s for s in enc.sequence_ids], dtype=np.int8),
        words=np.asarray([-1 if w is None else w for w in enc.word_ids], dtype=np.int64),
        tokens=list(enc.tokens),
        is_pair=is_pair,
    )


def _lowercases(state: dict[str, Any]) -> bool:
    """Whether a serialised normaliser is a Lowercase or a Sequence holding one directly."""
    kind = state.get("type")
    steps = state.get("normalizers") or []
    return kind == "Lowercase" or (kind == "Sequence" and any(n.get("type") == "Lowercase" for n in steps))


def token_ids_encoded(ids: Sequence[int], tokens: list[str]) -> Encoded:
    """Token ids taken as given, as one text: no special tokens are added (vLLM's and OpenAI's
    reading of token-id inputs), and there are no offsets into a text."""
    n = len(ids)
    return Encoded(
        ids=np.asarray(ids, dtype=np.int64),
        type_ids=np.zeros(n, dtype=np.int64),
        offsets=np.zeros((n, 2), dtype=np.int64),
        seq=np.full(n, FIRST, dtype=np.int8),
        words=np.full(n, -1, dtype=np.int64),
        tokens=tokens,
        is_pair=False,
    )


class TextEncoder:
    """Encodes texts and text pairs the way the model expects them."""

    def __init__(self, tokenizer_json: bytes | str, *, lowercase: bool = False) -> None:
        text = tokenizer_json.decode() if isinstance(tokenizer_json, bytes) else tokenizer_json
        try:
            self.tokenizer = Tokenizer.from_str(text)
        except Exception as exc:  # the tokenizers library raises plain Exceptions
            raise PackageError(f"tokenizer.json cannot be loaded: {exc}") from exc
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        if lowercase:
            self._lowercase()
        self.vocab_size = int(self.tokenizer.get_vocab_size(with_added_tokens=True))
        self.special_ids = {
            i for i, token in self.tokenizer.get_added_tokens_decoder().items() if token.special
        }

    def _lowercase(self) -> None:
        """sentence-transformers' `do_lower_case`: a Lowercase normaliser in front of the
        tokenizer's own unless that is, or directly holds, a Lowercase (its very test)."""
        current = self.tokenizer.normalizer
        state = json.loads(self.tokenizer.to_str()).get("normalizer") or {}
        if _lowercases(state):
            return
        steps = [normalizers.Lowercase()] + ([] if current is None else [current])
        self.tokenizer.normalizer = normalizers.Sequence(steps)

    def ids_input(self, ids: Sequence[int]) -> Encoded | int:
        """Token ids as an input, or the position of the first id outside the vocabulary."""
        bad = next((i for i, v in enumerate(ids) if not 0 <= v < self.vocab_size), None)
        if bad is not None:
            return bad
        return token_ids_encoded(ids, [self.tokenizer.id_to_token(v) or "" for v in ids])

    def special_tokens(self, *, pair: bool) -> int:
        """How many special tokens the post-processor adds to a single text or a pair."""
        return int(self.tokenizer.num_special_tokens_to_add(pair))

    def encode(self, inputs: Sequence[tuple[str, str | None]]) -> list[Encoded]:
        """Encode (text, optional pair) inputs; many in one call, so the Rust side can go parallel.

        A few inputs are encoded on the calling thread rather than handed to the tokenizer's
        thread pool: for a handful of short texts the hand-off costs more than it saves, and
        the pool's threads would compete with the forward's for the same cores. The gain is
        small, but a request never waits on another thread to tokenize.

        Longer texts always go through `encode_batch`, even one alone: the tokenizers library
        releases the GIL there and not in `encode`, which would hold every other Python thread
        (the app's event loop among them) for as long as a long text takes.
        """
        chars = sum(len(t) + len(p or "") for t, p in inputs)
        if len(inputs) <= _SERIAL_INPUTS and chars <= _SERIAL_CHARS:
            encodings = [self.tokenizer.encode(t, p, add_special_tokens=True) for t, p in inputs]
            return [_encoded(e, p is not None) for e, (_, p) in zip(encodings, inputs, strict=True)]
        batch: list[str | tuple[str, str]] = [t if p is None else (t, p) for t, p in inputs]
        encodings = self.tokenizer.encode_batch(batch, add_special_tokens=True)
        return [_encoded(e, p is not None) for e, (_, p) in zip(encodings, inputs, strict=True)]

    def encode_joined(self, texts: Sequence[str]) -> tuple[Encoded, list[int]]:
        """`texts` as one text: each tokenized alone without special tokens, their tokens
        concatenated in order, then the special tokens the post-processor puts around a single
        text. Returns the encoding and each text's token count (its tokens are consecutive)."""
        parts = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        whole = self.tokenizer.post_process(Encoding.merge(parts, growing_offsets=True))
        return _encoded(whole, False), [len(p.ids) for p in parts]
