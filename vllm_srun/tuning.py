"""Process settings for CPU forwards, applied before any engine imports torch.

Measured on this 2-core machine with the other core busy, as the event loop and Redis keep it
when serving: 2 spinning OpenMP threads fell to 18 texts/s and 860 ms for one text; 1 thread
gave 72 texts/s and 27 ms; 2 threads whose idle OpenMP threads sleep (PASSIVE) gave 70.
So the default is cores - 1 threads, and idle threads sleep.
"""

from __future__ import annotations

import os

# Read by the native engine when it loads a model on the cpu.
THREADS_ENV = "VLLM_SRUN_INTRA_OP_THREADS"


def default_threads() -> int:
    return max(1, (os.cpu_count() or 2) - 1)


def configure_cpu_threads(threads: int | None = None) -> int:
    """Set the intra-op thread count for CPU forwards of this process; returns it."""
    count = threads or default_threads()
    os.environ[THREADS_ENV] = str(count)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return count
