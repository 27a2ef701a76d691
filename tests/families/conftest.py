"""Shared by the family tests. The task_heads harness (packages, engines, the Transformers
reference) lives in `task_heads/harness.py`, its fixtures in `task_heads/conftest.py`."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _few_threads() -> Iterator[None]:
    # Tiny models: extra threads cost more in coordination than they give, and make timings noisy.
    if importlib.util.find_spec("torch") is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
