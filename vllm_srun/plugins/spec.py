"""`ModelSpec`: what a family tells an engine to build. Also importable from `plugins.base`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """What an engine must build: an architecture, its config and the weight files to read.

    The family resolves and verifies `weight_files` inside the package; an engine reads only
    these paths and never the package itself.
    """

    family: str
    architecture: str
    config: Mapping[str, Any]
    weight_files: tuple[Path, ...] = ()
    dtype: str = "float32"
    extra: Mapping[str, Any] = field(default_factory=dict)
