"""`vllm-srun bench ...`: the benchmark of a checkout (`python -m bench`), run from its root.

Every argument after `bench` is the bench's own; `main` hands them over before argparse sees them.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def add_parsers(sub: Any) -> None:
    # Listed for --help only: main() hands everything after "bench" to the bench's own parser.
    sub.add_parser("bench", help="run the benchmark from the repository root (vllm-srun bench --help)")


def cmd_bench(bench_args: list[str]) -> int:
    """`python -m bench` from a checkout: the bench lives beside the package, not in it."""
    sys.path.insert(0, os.getcwd())
    try:
        from bench.__main__ import main as bench_main
    except ImportError as exc:
        from vllm_srun.errors import ConfigError

        raise ConfigError(
            f"run `vllm-srun bench` from the repository root (bench/ not found: {exc})"
        ) from exc
    result: int = bench_main(bench_args[1:] if bench_args[:1] == ["--"] else bench_args)
    return result
