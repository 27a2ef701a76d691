"""Long inputs: reject, truncate or window. Nothing is cut without the result saying so.

An input is split into pieces (positions into its `Encoded`), each keeping its special tokens.
`reject`: an over-long input gets `max_length_exceeded`, its siblings are answered. `truncate`:
tokens are dropped from the end (or start), longest text first for a pair. `window`: the
(second) text is cut into overlapping windows; past `MAX_WINDOWS` it answers
`scan_budget_exceeded`. Characters are bounded before tokenizing (`bound_chars`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vllm_srun.errors import RequestTooLarge
from vllm_srun.families.task_heads.tokenize import FIRST, SECOND, SPECIAL, Encoded
from vllm_srun.plugins.base import ItemError
from vllm_srun.plugins.bodies import OVERFLOW_HINT, policy_words
from vllm_srun.plugins.surfaces import InputUsage

# Windows one input may be split into. Each window is a forward row, so the work of an input
# grows with its length times window.tokens / (window.tokens - overlap): without a bound, an
# overlap close to the window length would turn one long text into thousands of forwards.
MAX_WINDOWS = 1024
# Characters one token may stand for, generously: text runs at 3-6 characters per token under
# WordPiece, BPE and Unigram vocabularies, so an input longer than its budget times this is
# past its budget in any text but pathological ones (one long unknown "word", a run of
# whitespace), which are refused too rather than tokenized to find out.
CHARS_PER_TOKEN = 16


@dataclass(frozen=True)
class Overflow:
    """A request's long-input policy, validated against the model's limit."""

    mode: str  # "reject", "truncate" or "window"
    max_tokens: int
    window_tokens: int = 0
    overlap: int = 0
    left: bool = False  # truncate keeps each text's last tokens instead of its first
    # Whose limit `max_tokens` is, as an error message says it.
    limit: str = "the model takes at most"


def max_chars(policy: Overflow) -> int:
    """The most characters an input may have under `policy`, checked before tokenizing it.

    `reject` reads one budget's worth. `window` reads at most `MAX_WINDOWS` windows, so its
    input may be that many budgets long. `truncate` keeps one budget of tokens but needs the
    whole text's tokens to say how many there were and (for a pair) which text is longer, so
    it reads what `window` would: a long document can be sent whole and truncated, up to the
    same bound."""
    windows = 1 if policy.mode == "reject" else MAX_WINDOWS
    return policy.max_tokens * CHARS_PER_TOKEN * windows


def bound_chars(chars: Sequence[int], policy: Overflow, params: Sequence[str]) -> list[int | None]:
    """Each input's clip length: None to tokenize it whole, else the characters of it (and of
    its pair) to read. Under `reject` an input whose characters (`chars`: text, pair and prompt
    together) pass `max_chars(policy)` is clipped there, and `split` answers it
    `max_length_exceeded`; under `truncate` and `window` it is a RequestTooLarge (413) naming
    its field (`params`)."""
    cap = max_chars(policy)
    if policy.mode == "reject":
        return [cap if count > cap else None for count in chars]
    for count, param in zip(chars, params, strict=True):
        if count > cap:
            raise RequestTooLarge(
                f"{param}: {count} characters; at most {cap} are read for a budget of "
                f"{policy.max_tokens} tokens {policy_words(policy.mode)}",
                param=param,
            )
    return [None] * len(chars)


@dataclass(eq=False)
class Split:
    """The pieces one input is run as, or the error it is answered with instead."""

    pieces: list[np.ndarray]
    info: InputUsage
    error: ItemError | None = None
    # Under the window policy: each piece's [start, end) in content tokens of the windowed text.
    windows: list[tuple[int, int]] | None = None


def split(enc: Encoded, policy: Overflow) -> Split:
    n = len(enc)
    if policy.mode == "window":
        if n <= policy.window_tokens:
            whole = _whole(n)
            whole.windows = [(0, int((_ranks(enc, _windowed(enc)) >= 0).sum()))]
            return whole
        return _windows(enc, policy)
    if n <= policy.max_tokens and not enc.clipped:
        return _whole(n)
    if policy.mode == "truncate":
        keep = _truncated(enc, policy.max_tokens, left=policy.left)
        return Split([keep], InputUsage(tokens=n, processed_tokens=len(keep), truncated=True))
    if enc.clipped:  # only its first max_chars were tokenized: n is a lower bound
        return Split(
            [],
            InputUsage(tokens=n, processed_tokens=0, truncated=False, tokens_lower_bound=True, windows=0),
            ItemError(
                "max_length_exceeded",
                f"input has more than {max_chars(policy)} characters (at least {n} tokens, read no "
                f"further); {policy.limit} {policy.max_tokens} {OVERFLOW_HINT}",
            ),
        )
    return Split(
        [],
        InputUsage(tokens=n, processed_tokens=0, truncated=False, windows=0),
        ItemError(
            "max_length_exceeded",
            f"input has {n} tokens; {policy.limit} {policy.max_tokens} {OVERFLOW_HINT}",
        ),
    )


def _whole(n: int) -> Split:
    return Split([np.arange(n, dtype=np.int64)], InputUsage(tokens=n, processed_tokens=n, truncated=False))


def _ranks(enc: Encoded, which: int) -> np.ndarray:
    """For positions of text `which`, their rank within that text; -1 elsewhere."""
    mask = enc.seq == which
    ranks = np.full(len(enc), -1, dtype=np.int64)
    ranks[mask] = np.arange(int(mask.sum()))
    return ranks


def _kept(ranks: np.ndarray, count: int, keep: int, *, left: bool) -> np.ndarray:
    """Positions of one text that survive: its first `keep` tokens, or its last with `left`."""
    out: np.ndarray = (ranks >= 0) & (ranks >= count - keep if left else ranks < keep)
    return out


def _truncated(enc: Encoded, max_tokens: int, *, left: bool = False) -> np.ndarray:
    first = int((enc.seq == FIRST).sum())
    second = int((enc.seq == SECOND).sum())
    room = max(max_tokens - (len(enc) - first - second), 0)
    # Longest first: trim the longer text down to the shorter one, then both evenly.
    small = min(first, second)
    if small <= room - small:
        small_kept, large_kept = small, room - small
    else:
        small_kept, large_kept = room // 2, room - room // 2
    keep_first, keep_second = (small_kept, large_kept) if first <= second else (large_kept, small_kept)
    mask = (enc.seq == SPECIAL) | _kept(_ranks(enc, FIRST), first, keep_first, left=left)
    mask |= _kept(_ranks(enc, SECOND), second, keep_second, left=left)
    return np.flatnonzero(mask)


def _windowed(enc: Encoded) -> int:
    """The text windows cut: a pair's second (a rerank's document), else the only one."""
    return SECOND if enc.is_pair and bool((enc.seq == SECOND).any()) else FIRST


def _windows(enc: Encoded, policy: Overflow) -> Split:
    n = len(enc)
    ranks = _ranks(enc, _windowed(enc))
    length = int((ranks >= 0).sum())
    room = policy.window_tokens - (n - length)
    step = room - policy.overlap
    if step < 1:
        return Split(
            [],
            InputUsage(tokens=n, processed_tokens=0, truncated=False, windows=0),
            ItemError(
                "max_length_exceeded",
                f"input has {n - length} tokens besides the windowed text, leaving no room for windows "
                f"of {policy.window_tokens} tokens with overlap {policy.overlap}",
            ),
        )
    count = 1 + -(-(length - room) // step)  # windows start at 0, step, ... until one reaches the end
    if count > MAX_WINDOWS:
        # Upstream's code for an input read in windows that is longer than its scan budget.
        return Split(
            [],
            InputUsage(tokens=n, processed_tokens=0, truncated=False, windows=0),
            ItemError(
                "scan_budget_exceeded",
                f"input needs {count} windows of {policy.window_tokens} tokens with overlap "
                f"{policy.overlap}; at most {MAX_WINDOWS} per input (raise options.window.tokens "
                "or lower options.window.overlap)",
            ),
        )
    # Positions outside the windowed text go in every window; the text's positions are in rank
    # order, so each window is a slice of them (linear in the window, not in the input).
    fixed, text = np.flatnonzero(ranks < 0), np.flatnonzero(ranks >= 0)
    starts = range(0, count * step, step)
    pieces = [np.sort(np.concatenate((fixed, text[start : start + room]))) for start in starts]
    processed = sum(len(p) for p in pieces)
    info = InputUsage(tokens=n, processed_tokens=processed, truncated=False, windows=len(pieces))
    return Split(pieces, info, windows=[(start, min(start + room, length)) for start in starts])
