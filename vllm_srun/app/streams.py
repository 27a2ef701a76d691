"""How many job event streams (SSE) a replica holds open: overall and per caller.

Each open stream holds a connection, a task and a read of Redis; unbounded, they would take the
request path's Redis pool. Past either cap a new stream is refused with 429 and Retry-After
before it reads anything.
"""

from __future__ import annotations

from collections import Counter

from vllm_srun.errors import Overloaded

RETRY_AFTER_S = 5


class StreamSlot:
    """One open stream's place; `release` gives it back (once, however often it is called)."""

    def __init__(self, slots: StreamSlots, caller: str) -> None:
        self._slots, self._caller, self._held = slots, caller, True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._slots._give_back(self._caller)


class StreamSlots:
    """At most `total` streams at once, and `per_caller` for any one caller."""

    def __init__(self, total: int, per_caller: int) -> None:
        self.total, self.per_caller = total, per_caller
        self.open = 0
        self._by_caller: Counter[str] = Counter()

    def take(self, caller: str) -> StreamSlot:
        """A slot for `caller` (a caller id, or a client address where no key is taken), or
        Overloaded (429) naming the cap that is full."""
        if self.open >= self.total:
            raise Overloaded(
                f"this replica has {self.total} event streams open (--max-event-streams); retry later",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        if self._by_caller[caller] >= self.per_caller:
            raise Overloaded(
                f"you have {self.per_caller} event streams open (--max-event-streams-per-caller); "
                "close one or retry later",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        self.open += 1
        self._by_caller[caller] += 1
        return StreamSlot(self, caller)

    def _give_back(self, caller: str) -> None:
        self.open -= 1
        self._by_caller[caller] -= 1
        if self._by_caller[caller] <= 0:
            del self._by_caller[caller]
