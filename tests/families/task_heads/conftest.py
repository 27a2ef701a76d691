"""Fixtures of the task_heads tests: `th` (the session's `Harness`) and `engine` (each engine
that can run here). Tests marked `torch` need torch (fixture weights, the native engine, the
Transformers reference) and are skipped where it is missing; every other test runs without it,
which `test_without_torch.py` checks."""

from __future__ import annotations

import importlib.util

import pytest
from families.task_heads.harness import ENGINES, Harness


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "torch: needs torch and transformers (fixture weights, engines, the reference)"
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("torch") is None:
        return
    for name in ("torch", "transformers"):
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"needs {name}")


@pytest.fixture(scope="session")
def th(tmp_path_factory: pytest.TempPathFactory) -> Harness:
    return Harness(tmp_path_factory.mktemp("task-heads"))


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)
