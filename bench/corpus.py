"""The bench corpus: deterministic English-ish texts, and a variant where 30% are repeats.

The texts come from `vllm_srun.registry.corpus` (a fixed word list and `random.Random(seed)`,
5-120 words each), the corpus of the forward bench and of the approximation check, so they all
measure the same kind of input.
"""

from __future__ import annotations

import random

from vllm_srun.registry.corpus import corpus

__all__ = ["corpus", "warm_texts", "with_repeats"]

# Warm-up texts use seeds far from the corpus seed, so warming never fills the cache with a
# text that is measured later.
WARM_SEED = 1_000_003


def warm_texts(count: int, round_: int = 0) -> list[str]:
    """Texts for warming a server or an engine; distinct from every corpus(seed < 1e6) text."""
    return corpus(count, seed=WARM_SEED + round_)


def with_repeats(texts: list[str], fraction: float = 0.3, seed: int = 1) -> tuple[list[str], list[int]]:
    """A list as long as `texts` in which `fraction` of the entries repeat an earlier entry.

    Returns (sequence, first) where `first[i]` is the index in `sequence` of the first
    occurrence of `sequence[i]` (`first[i] == i` for a first occurrence). The unique texts are
    `texts[: len(texts) - repeats]` in order; each repeat is placed after its original.
    """
    rng = random.Random(seed)
    repeats = round(len(texts) * fraction)
    unique = texts[: len(texts) - repeats]
    if not unique:
        return [], []
    sequence: list[str] = list(unique)
    first: list[int] = list(range(len(unique)))
    for _ in range(repeats):
        # A repeat of an entry that is already in the sequence, inserted somewhere after it.
        source = first[rng.randrange(len(sequence))]
        position = rng.randint(source + 1, len(sequence))
        sequence.insert(position, sequence[source])
        first = [f if f < position else f + 1 for f in first]
        first.insert(position, source)
    return sequence, first
