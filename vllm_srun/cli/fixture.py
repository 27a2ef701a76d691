"""`vllm-srun fixture OUT --family NAME`: a small model package from a family's fixture writer.

OUT must be new, empty, or a directory this command wrote before (it holds FIXTURE_MARKER),
which is then replaced whole. Prints the package's path.
"""

from __future__ import annotations

import argparse
import importlib
import shutil
from pathlib import Path
from typing import Any

# Left in a directory `vllm-srun fixture` wrote, so writing there again may replace it.
FIXTURE_MARKER = ".vllm-srun-fixture"


def add_parsers(sub: Any) -> None:
    fixture = sub.add_parser("fixture", help="write a small model package with a family's fixture writer")
    fixture.add_argument("out", type=Path, help="directory to write")
    fixture.add_argument("--family", required=True, help="family whose fixture writer to run")
    fixture.add_argument("--variant", default=None, help="which fixture the writer makes")
    fixture.add_argument("--onnx", action="store_true", help="also export an ONNX graph")


def cmd_fixture(args: argparse.Namespace) -> int:
    from vllm_srun.errors import ConfigError
    from vllm_srun.plugins.discovery import load_plugins

    out: Path = args.out  # "" parses as ".": refused below unless the current directory is empty
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{str(out)!r} is not a directory")
    if out.exists() and any(out.iterdir()):
        if not (out / FIXTURE_MARKER).is_file():
            raise ConfigError(f"{str(out)!r} exists and is not empty: give a new or empty directory")
        shutil.rmtree(out)  # a fixture this command wrote before: replaced whole, no stale files
    family = load_plugins().family(args.family)
    if not family.fixture_writer:
        raise ConfigError(f"family {args.family!r} has no fixture writer")
    module_name, _, attr = family.fixture_writer.partition(":")
    writer = getattr(importlib.import_module(module_name), attr)
    try:
        written = writer(out, variant=args.variant, onnx=args.onnx)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    except OSError as exc:
        raise ConfigError(f"cannot write {str(out)!r}: {exc.strerror or exc}") from exc
    (Path(written) / FIXTURE_MARKER).write_text("written by `vllm-srun fixture`; rewritten in place\n")
    print(written)
    return 0
