"""tokenize.py: the package's tokenizer with its own padding and truncation off, special tokens
from its post-processor, and offsets in code points. Tokenizer only: no torch."""

from __future__ import annotations

import numpy as np
from families.task_heads.harness import LONG, MULTIBYTE, TEXTS, Harness

from vllm_srun.families.task_heads.tokenize import FIRST, SECOND, SPECIAL, TextEncoder


def _encoder(th: Harness, variant: str) -> TextEncoder:
    return TextEncoder((th.plan_package(variant) / "tokenizer.json").read_bytes())


def test_few_and_many_inputs_encode_alike(th: Harness) -> None:
    # A few inputs are encoded one by one, more in one batch call: both must give the same tokens.
    encoder = _encoder(th, "bert-sequence")
    inputs: list[tuple[str, str | None]] = [(t, None) for t in TEXTS] + [("what is it", "paris")]
    many = encoder.encode(inputs)
    few = [encoder.encode([pair])[0] for pair in inputs]
    assert len(many) == len(inputs) > 4
    for a, b in zip(many, few, strict=True):
        assert a.tokens == b.tokens and a.is_pair == b.is_pair
        for field in ("ids", "type_ids", "offsets", "seq", "words"):
            np.testing.assert_array_equal(getattr(a, field), getattr(b, field))


def test_special_tokens_and_positions(th: Harness) -> None:
    for variant in ("bert-sequence", "modernbert-sequence", "mmbert-sequence"):
        encoder = _encoder(th, variant)
        assert encoder.special_tokens(pair=False) == 2, variant
        assert encoder.special_tokens(pair=True) == 3, variant
        (enc,) = encoder.encode([("john lives in paris", "paris is a city")])
        assert enc.is_pair and int((enc.seq == SPECIAL).sum()) == 3
        # The first text, then the second: never interleaved.
        texts = enc.seq[enc.seq != SPECIAL].tolist()
        assert texts == sorted(texts) and {FIRST, SECOND} == set(texts)
        assert all(tuple(enc.offsets[i]) == (0, 0) for i in np.flatnonzero(enc.seq == SPECIAL))


def test_offsets_are_code_points(th: Harness) -> None:
    encoder = _encoder(th, "bert-token")
    (enc,) = encoder.encode([(MULTIBYTE, None)])
    for start, end in enc.offsets[enc.seq == FIRST].tolist():
        assert 0 <= start < end <= len(MULTIBYTE)
    start, end = enc.offsets[enc.tokens.index("paris")].tolist()
    assert MULTIBYTE[start:end] == "Paris"  # after emoji and CJK: code points, not bytes


def test_the_packages_padding_and_truncation_are_ignored(th: Harness) -> None:
    # Packages often ship a tokenizer.json that pads and truncates; windows.py decides about
    # long inputs and the engine pads per batch, so the encoder turns both off.
    tokenizer = _encoder(th, "bert-sequence").tokenizer
    tokenizer.enable_truncation(40)
    tokenizer.enable_padding(length=32)
    assert len(tokenizer.encode(LONG).ids) == 40 and len(tokenizer.encode("good").ids) == 32
    encoder = TextEncoder(tokenizer.to_str())
    long, short = encoder.encode([(LONG, None), ("good", None)])
    assert len(long) > 128 and len(short) == 3
