"""Token classification: per-token logits to labelled spans of the input text.

A word takes the label of its first token, so a span never ends inside a word; tags may be
BIO/BIOES or plain. Offsets are code points into the input text, end exclusive, whitespace
trimmed. A span's probability is the mean of its words' first-token probabilities. With
windows, overlapping spans of one label are merged, keeping the higher probability.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vllm_srun.families.task_heads.heads import softmax
from vllm_srun.families.task_heads.tokenize import FIRST, Encoded
from vllm_srun.plugins.surfaces import Span, TokenProbabilities

_OUTSIDE = "O"


@dataclass
class _Word:
    label: str
    score: float
    start: int
    end: int


def _tag(label: str) -> tuple[str | None, str]:
    if len(label) > 2 and label[1] in "-_" and label[0] in "BIESLU":
        return label[0], label[2:]
    return None, label


def _words(enc: Encoded, piece: np.ndarray, probs: np.ndarray, labels: Sequence[str]) -> list[_Word]:
    """The words of the first text inside one piece, in order, each labelled by its first token."""
    words: list[_Word] = []
    last_key: int | None = None
    best = probs.argmax(axis=-1)
    for row, pos in enumerate(piece.tolist()):
        if enc.seq[pos] != FIRST:
            continue
        start, end = (int(x) for x in enc.offsets[pos])
        # A token without a word id (an added token in the text) is a word of its own.
        key = int(enc.words[pos]) if enc.words[pos] >= 0 else -1 - pos
        if key == last_key:
            words[-1].start = min(words[-1].start, start)
            words[-1].end = max(words[-1].end, end)
            continue
        last_key = key
        words.append(_Word(labels[int(best[row])], float(probs[row, best[row]]), start, end))
    return words


def _decode(words: list[_Word]) -> list[tuple[str, list[_Word]]]:
    spans: list[tuple[str, list[_Word]]] = []
    current: tuple[str, list[_Word]] | None = None
    for word in words:
        prefix, kind = _tag(word.label)
        if word.label == _OUTSIDE:
            current = None
            continue
        starts = prefix in ("B", "S", "U") or current is None or current[0] != kind
        if starts:
            current = (kind, [word])
            spans.append(current)
        else:
            assert current is not None
            current[1].append(word)
        if prefix in ("E", "S", "L", "U"):
            current = None
    return spans


def _trim(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def _spans_of(text: str, words: list[_Word], threshold: float | None) -> list[Span]:
    out: list[Span] = []
    for kind, members in _decode(words):
        score = float(np.mean([w.score for w in members]))
        if threshold is not None and score < threshold:
            continue
        start, end = _trim(text, members[0].start, max(w.end for w in members))
        if start < end:
            out.append(Span(label=kind, start=start, end=end, text=text[start:end], probability=score))
    return out


def _union(text: str, spans: list[Span]) -> list[Span]:
    merged: list[Span] = []
    for span in sorted(spans, key=lambda s: (s.start, s.end, s.label)):
        # Merge into the latest earlier span of the same label that overlaps this one.
        for prev in reversed(merged):
            if prev.label == span.label and span.start < prev.end:
                prev.end = max(prev.end, span.end)
                prev.text = text[prev.start : prev.end]
                prev.probability = max(prev.probability, span.probability)
                break
        else:
            merged.append(span)
    return merged


def token_readout(
    text: str,
    enc: Encoded,
    pieces: Sequence[np.ndarray],
    logits: Sequence[np.ndarray],
    labels: Sequence[str],
    *,
    threshold: float | None,
    return_tokens: bool,
) -> tuple[list[Span], list[TokenProbabilities] | None]:
    """Spans over `text` (and per-token readings if asked) from each piece's token logits."""
    spans: list[Span] = []
    # For per-token output, a token seen in several windows is read from the window where it
    # sits farthest from a cut edge, where the model saw the most context around it.
    chosen: dict[int, tuple[int, TokenProbabilities]] = {}
    for piece, window_logits in zip(pieces, logits, strict=True):
        probs = softmax(window_logits.astype(np.float64))
        spans.extend(_spans_of(text, _words(enc, piece, probs, labels), threshold))
        if not return_tokens:
            continue
        for row, pos in enumerate(piece.tolist()):
            if enc.seq[pos] != FIRST:
                continue
            margin = min(row, len(piece) - 1 - row)
            if pos in chosen and chosen[pos][0] >= margin:
                continue
            best = int(probs[row].argmax())
            start, end = _trim(text, int(enc.offsets[pos][0]), int(enc.offsets[pos][1]))
            reading = TokenProbabilities(
                start=start,
                end=end,
                probabilities=probs[row].tolist(),
                token=enc.tokens[pos],
                label=labels[best],
            )
            chosen[pos] = (margin, reading)
    tokens = [chosen[pos][1] for pos in sorted(chosen)] if return_tokens else None
    return (_union(text, spans) if len(pieces) > 1 else spans), tokens
