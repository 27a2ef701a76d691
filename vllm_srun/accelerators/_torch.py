"""Shared probe for accelerators that are found through torch, when torch is installed."""

from __future__ import annotations

import importlib.util
from types import ModuleType


def torch_or_none() -> ModuleType | None:
    """torch if it is installed and imports; None otherwise (never an error here)."""
    if importlib.util.find_spec("torch") is None:
        return None
    try:
        import torch
    except Exception:
        return None
    return torch


def cpu_only_build() -> bool:
    """Whether the installed torch is a CPU-only build, known from its distribution's version
    (PyTorch's CPU wheels carry the local label `+cpu`) without importing it: the import costs
    seconds of every start, and a process that serves no torch model needs none."""
    import importlib.metadata

    try:
        return importlib.metadata.version("torch").endswith("+cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
