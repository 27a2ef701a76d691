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
