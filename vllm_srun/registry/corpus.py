"""A deterministic corpus of English-ish texts: the bench's inputs and the approximation check's.

No download: a fixed word list and `random.Random(seed)`; the same seed gives the same texts
on every machine.
"""

from __future__ import annotations

import random

WORDS = (
    "the of and to in is was for on that with as by at from it his an were are which this be has "
    "had not or have one their first new after two who they its also but been more other all "
    "time years into city world over most during such many people school american made three "
    "only later some national united then where well may between state known team river house "
    "music game film because through year under while several against local search engine small "
    "model encoder vector sentence question answer server request batch token quickly slowly "
    "bright quiet garden window mountain coffee morning evening summer winter library station "
    "language computer network system running careful history science market travel weather "
    "beautiful ancient modern simple complex different important possible nothing everything "
    "Paris London Tokyo Berlin Madrid Nairobi Toronto Sydney Cairo Lima email invoice account "
    "number address yesterday tomorrow because however although therefore meanwhile"
).split()


def corpus(count: int, seed: int = 0) -> list[str]:
    """Deterministic English-ish texts of 5-120 words with some punctuation."""
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        words = [rng.choice(WORDS) for _ in range(rng.randint(5, 120))]
        for _ in range(rng.randint(0, len(words) // 10)):
            words[rng.randrange(len(words))] += rng.choice(",.;?!")
        words[0] = words[0].capitalize()
        texts.append(" ".join(words) + rng.choice(".?!"))
    return texts
