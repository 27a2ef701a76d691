"""Process settings for CPU forwards, applied before any engine imports torch.

Measured on this 2-core machine, MiniLM, batches of 32 (README: Tuning). With the other core
busy: 2 OpenMP threads spinning (the default wait policy) fell to 18 texts/s and 860 ms for
one text; 2 threads that sleep when idle (PASSIVE) gave 70 texts/s, 1 thread 72. Idle machine:
2 PASSIVE threads 138 texts/s, 1 thread 74. So: every core, and idle threads sleep.
"""

from __future__ import annotations

import os

# Read by the native engine when it loads a model on the cpu.
THREADS_ENV = "VLLM_SRUN_INTRA_OP_THREADS"


def default_threads() -> int:
    return os.cpu_count() or 1


def configure_cpu_threads(threads: int | None = None) -> int:
    """Set the intra-op thread count for CPU forwards of this process; returns it."""
    count = threads or default_threads()
    os.environ[THREADS_ENV] = str(count)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return count
