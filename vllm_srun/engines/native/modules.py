"""Finding and swapping submodules by dotted name: what packing and quantizing a model share."""

from __future__ import annotations

from collections.abc import Iterator

from torch import nn


def linears(module: nn.Module) -> Iterator[tuple[str, nn.Linear]]:
    """Every `nn.Linear` of `module` by its dotted name."""
    for name, child in module.named_modules():
        if isinstance(child, nn.Linear):
            yield name, child


def replace(module: nn.Module, name: str, new: nn.Module) -> nn.Module:
    """Put `new` at dotted `name` in `module`; return what was there."""
    parent_name, _, leaf = name.rpartition(".")
    parent = module.get_submodule(parent_name) if parent_name else module
    old = getattr(parent, leaf)
    setattr(parent, leaf, new)
    return old  # type: ignore[no-any-return]
