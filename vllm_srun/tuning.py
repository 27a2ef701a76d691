"""Process and thread settings for CPU forwards.

Two choices, measured in `bench/` (docs/performance.md: Tuning): idle OpenMP threads spin briefly
(OMP_SPIN_COUNT), then sleep, so a forward's parallel regions do not each wake a sleeping pool
while a pool idle between forwards soon gives its core away; and CPU forwards use every core
by default.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from vllm_srun import defaults

# How much lower than the event loop the forward threads run (a nice increment; 0: the same).
FORWARD_NICE_ENV = "VLLM_SRUN_FORWARD_NICE"
# Spins an idle OpenMP thread makes before it sleeps (GNU OpenMP's GOMP_SPINCOUNT; by its own
# estimate about 0.3 ms): longer than the gaps between one forward's parallel regions, far
# shorter than those between forwards. GNU OpenMP spins only while it manages no more threads
# than there are cores, hence one thread per device for all torch work (app.loading.Executors).
OMP_SPIN_COUNT = 30_000


def default_threads() -> int:
    return os.cpu_count() or 1


def configure_cpu_threads(threads: int | None = defaults.INTRA_OP_THREADS) -> int:
    """The intra-op thread count for this process's CPU forwards (`threads`, or every core).

    Call it before any engine imports torch: unless the environment sets OMP_WAIT_POLICY, idle
    OpenMP threads spin OMP_SPIN_COUNT times and then sleep (`OMP_WAIT_POLICY=PASSIVE` with
    `GOMP_SPINCOUNT`, unless that is set too), which the OpenMP runtime reads once, when it
    starts. The count it returns is a setting to hand on (`ServerSettings.intra_op_threads`);
    `start_forward_thread` applies it.
    """
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        os.environ.setdefault("GOMP_SPINCOUNT", str(OMP_SPIN_COUNT))
    return threads or default_threads()


def set_intra_op_threads(threads: int) -> None:
    """Give torch's CPU forwards `threads` threads, where torch is already loaded.

    Only the native engine imports torch; an engine that does not (onnxruntime sizes its own
    pool) is left alone, and nothing here imports torch into a process that has none.
    """
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(threads)


@contextmanager
def intra_op_threads(threads: int) -> Iterator[None]:
    """torch's CPU forwards on `threads` threads inside the block, the count before it after.

    No-op where torch is not loaded or already runs that many."""
    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else threads
    if torch is None or before == threads:
        yield
        return
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# The intra-op thread count the forward executors apply (None: torch's own choice), for an
# engine that sizes a thread pool of its own at load, before any forward thread exists.
_forward_threads: int | None = None


def set_forward_threads(threads: int | None) -> None:
    """Record the count the forward executors will apply (`start_forward_thread`)."""
    global _forward_threads
    _forward_threads = threads


def forward_threads() -> int | None:
    """The count the forward executors apply; None where none is set (torch's own choice)."""
    return _forward_threads


def start_forward_thread(intra_op_threads: int | None = None) -> None:
    """The initializer of a forward executor: a lower priority, and the thread count when given.

    The executor's thread starts on the first step of bringing a model up (its load), after
    `prepare` has imported torch for the engine (`torch_device_of`), so torch is there to be
    told; an engine that first imports torch inside its load would not be.
    """
    lower_forward_priority()
    if intra_op_threads is not None:
        set_intra_op_threads(intra_op_threads)


def lower_forward_priority() -> None:
    """Run the calling thread, and the OpenMP threads it will start, at a lower priority.

    Forwards keep every core busy; the event loop (HTTP, Redis, cache hits) and the Redis
    server then wait for a scheduler slice behind them. On Linux the nice value is per thread
    and inherited by the threads a thread starts, so only forward work gives way; raising
    one's own nice value needs no privilege. Elsewhere, or if refused, nothing changes.
    """
    try:
        increment = int(os.environ.get(FORWARD_NICE_ENV, defaults.FORWARD_NICE))
    except ValueError:  # a malformed setting must not break the executor: run at normal priority
        return
    if increment <= 0 or not hasattr(os, "setpriority"):
        return
    tid = threading.get_native_id()
    try:
        current = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, current + increment))
    except OSError:
        pass


_trimmed_at = 0.0


@functools.cache
def _libc() -> Any:
    """glibc, where `malloc_trim` is there to call; None elsewhere. Looked up once: the lookup
    runs a subprocess."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


def return_freed_memory(every_s: float = 0.0) -> bool:
    """Hand the heap's free pages back to the OS (glibc's `malloc_trim(0)`), at most once per
    `every_s` seconds in this process; whether it ran. Forwards of ever-new shapes free blocks
    of ever-new sizes, which glibc keeps, fragmented, and RSS counts (docs/performance.md,
    "Memory under ever-new batch shapes"). Nothing where there is no glibc."""
    global _trimmed_at
    now = time.monotonic()
    if now - _trimmed_at < every_s:
        return False
    _trimmed_at = now
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
