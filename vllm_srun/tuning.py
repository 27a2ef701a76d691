"""Process settings for CPU forwards, applied before any engine imports torch.

Measured on this 2-core machine, MiniLM, batches of 32 (README: Tuning). With the other core
busy: 2 OpenMP threads spinning (the default wait policy) fell to 18 texts/s and 860 ms for
one text; 2 threads that sleep when idle (PASSIVE) gave 70 texts/s, 1 thread 72. Idle machine:
2 PASSIVE threads 138 texts/s, 1 thread 74. So: every core, and idle threads sleep.
"""

from __future__ import annotations

import os
import threading

# Read by the native engine when it loads a model on the cpu.
THREADS_ENV = "VLLM_SRUN_INTRA_OP_THREADS"
# How much lower than the event loop the forward threads run (a nice increment; 0: the same).
FORWARD_NICE_ENV = "VLLM_SRUN_FORWARD_NICE"
DEFAULT_FORWARD_NICE = 10


def default_threads() -> int:
    return os.cpu_count() or 1


def configure_cpu_threads(threads: int | None = None) -> int:
    """Set the intra-op thread count for CPU forwards of this process; returns it."""
    count = threads or default_threads()
    os.environ[THREADS_ENV] = str(count)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return count


def lower_forward_priority() -> None:
    """Run the calling thread, and the OpenMP threads it will start, at a lower priority.

    The initializer of the forward executors. Forwards keep every core busy; the event loop
    (HTTP, Redis, cache hits) and the Redis server then wait for a scheduler slice behind them,
    several milliseconds on a loaded 2-core machine. On Linux the nice value is per thread and
    inherited by the threads a thread starts, so only forward work gives way; raising one's own
    nice value needs no privilege. Elsewhere, or if refused, nothing changes.
    """
    try:
        increment = int(os.environ.get(FORWARD_NICE_ENV, DEFAULT_FORWARD_NICE))
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
