"""Shared fixtures: a real Redis server, model packages, servers run as processes."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# Every response on upstream's paths is checked against its contract (tests/contract/hook.py).
from contract.hook import (  # noqa: F401
    pytest_configure,
    pytest_runtest_call,
    pytest_runtest_protocol,
    pytest_terminal_summary,
    upstream_contract,
)
from helpers import Proc, RedisProcess, Server, write_keywords

from vllm_srun.engines.native.graph_cache import CACHE_ENV


def _session_graph_cache() -> None:
    """One small-batch graph cache for every process of this run (pytest's own, the servers
    and workers it starts, xdist's workers, which inherit it): each fixture's graph is exported
    once, by the first load, and the user's own cache is never touched. Made by the first
    process that imports this file and removed when that process exits."""
    if CACHE_ENV in os.environ:
        return
    folder = tempfile.mkdtemp(prefix="vllm-srun-test-cache-")
    os.environ[CACHE_ENV] = folder
    atexit.register(shutil.rmtree, folder, True)


_session_graph_cache()


@pytest.fixture
def keywords(tmp_path: Path) -> Path:
    return write_keywords(tmp_path / "keywords")


@pytest.fixture
def redis_proc(tmp_path: Path) -> Iterator[RedisProcess]:
    proc = RedisProcess(tmp_path / "redis.log")
    yield proc
    proc.stop()


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """Call with serve arguments; every server started is stopped after the test."""
    started: list[Proc] = []

    def start(*args: str, env: dict[str, str] | None = None, ready: bool = True) -> Server:
        server = Server(list(args), tmp_path / f"server-{len(started)}.log", env)
        started.append(server)
        return server.wait_ready() if ready else server

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture(scope="module")
def module_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Server]]:
    """Like start_server, but the servers live for the whole test module."""
    started: list[Proc] = []
    root = tmp_path_factory.mktemp("module-server")

    def start(*args: str, env: dict[str, str] | None = None) -> Server:
        server = Server(list(args), root / f"server-{len(started)}.log", env)
        started.append(server)
        return server.wait_ready()

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    """Processes a test starts itself: whatever is still running at its end is killed."""
    started: list[Proc] = []
    yield started
    for proc in started:
        proc.stop(signal.SIGKILL)
