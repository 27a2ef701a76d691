"""`vllm-srun plugins`, `devices` and `models`: what this installation can serve, and where.

Each prints a table, or JSON with `--json` (`devices` always prints JSON: the router reads its
`auto`). `devices` exits 1 when no accelerator offers a device; `models` 2 on a table conflict.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_parsers(sub: Any) -> None:
    plugins = sub.add_parser("plugins", help="list installed families, engines, accelerators, stat loggers")
    plugins.add_argument("--json", action="store_true", help="print JSON")

    sub.add_parser("devices", help="print JSON: each accelerator's devices and the one --device auto takes")

    models = sub.add_parser("models", help="list the built-in models and their pins")
    models.add_argument("--json", action="store_true", help="print JSON")
    models.add_argument(
        "--architectures",
        action="store_true",
        help="list the architectures that load (model types, classes, heads) instead",
    )


def cmd_plugins(args: argparse.Namespace) -> int:
    from vllm_srun.accelerators._torch import torch_or_none
    from vllm_srun.plugins.discovery import GROUPS, load_plugins

    torch_or_none()  # loaded here so that torch-based accelerators report what they find
    described = load_plugins().describe()
    if args.json:
        print(json.dumps(described, indent=2))
        return 0
    for group in GROUPS:
        print(f"{group}:")
        for entry in described[group]:
            print(f"  {entry['name']:<20} {entry['distribution']} {entry['version']}  ({entry['target']})")
    if described["refused"]:
        print("refused:")
        for entry in described["refused"]:
            print(f"  {entry['group']}/{entry['name']} from {entry['distribution']}: {entry['reason']}")
    return 0


def cmd_devices(args: argparse.Namespace) -> int:
    """What the router asks before it places a deployment on `auto` (see vllm_srun.cli.managed)."""
    from vllm_srun.accelerators._torch import torch_or_none
    from vllm_srun.cli.managed import devices_report
    from vllm_srun.plugins.discovery import load_plugins

    torch_or_none()  # loaded so that torch-based accelerators report what they find
    report = devices_report(load_plugins())
    print(json.dumps(report))
    if report["auto"] is None:
        print("error: no accelerator is available for --device auto", file=sys.stderr)
        return 1
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from vllm_srun.plugins.discovery import load_plugins
    from vllm_srun.registry.tables import describe_tables, load_tables

    if args.architectures:
        return _print_architectures(as_json=args.json)

    tables = load_tables(e.plugin for e in load_plugins().of("families").values())
    rows = describe_tables(tables)
    if args.json:
        print(json.dumps({"models": rows, "conflict": tables.conflict}, indent=2))
    else:
        for row in rows:
            print(
                f"{row['name']:<24} {row['family']:<18} {row['repository']}@{row['revision'][:12]}  "
                f"sha256 {row['model_sha256'][:16]}  {row['licence']}"
            )
    for skipped in tables.skipped:
        print(f"skipped table {skipped.module}: {skipped.reason}", file=sys.stderr)
    if tables.conflict:
        print(f"error: {tables.conflict}", file=sys.stderr)
        return 2
    return 0


def _print_architectures(*, as_json: bool) -> int:
    """Every row of the architecture table (built-in and from plugins): what loads natively.
    Any other model type serves from its package's onnx/model.onnx."""
    from vllm_srun.plugins.architectures import architectures
    from vllm_srun.plugins.discovery import load_plugins

    load_plugins()  # plugins' rows join the table
    rows = [arch.descriptor() for arch in architectures()]
    if as_json:
        print(json.dumps({"architectures": rows}, indent=2))
        return 0
    for row in rows:
        kinds = sorted({kind for kind in row["classes"].values()})
        print(f"{row['name']:<12} model_type {', '.join(row['model_types']):<34} heads {', '.join(kinds)}")
        for cls, kind in row["classes"].items():
            print(f"    {cls:<44} {kind}")
    print("any other model_type: serves on onnxruntime from its onnx/model.onnx")
    return 0
