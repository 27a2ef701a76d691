"""Shared fixtures: a real Redis server, model packages, servers run as processes."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# Every response on upstream's paths is checked against its contract (tests/contract/hook.py).
from contract.hook import (  # noqa: F401
    pytest_configure,
    pytest_runtest_call,
    pytest_runtest_protocol,
    pytest_sessionfinish,
    pytest_terminal_summary,
    pytest_testnodedown,
    upstream_contract,
)
from helpers import Proc, RedisProcess, Server, minilm_dir, write_keywords

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

# Modules whose tests bound a latency or a wall time within a few seconds (a live probe that
# answers within a second under hostile load, a lease lapsing on time, a stop within its grace):
# marked `serial`, which .ci/run runs in a pass of its own after the parallel one, so no other
# test of the run shares the cores with them.
SERIAL = {
    "tests/app/test_hostile.py",
    "tests/app/test_hostile_load.py",
    "tests/app/test_streams_hostile.py",
    "tests/queue/test_client.py",
    "tests/queue/test_replies.py",
    "tests/testing/test_netfault.py",
    "tests/queue/worker/test_coalescer.py",
    "tests/queue/worker/test_leases.py",
    "tests/cli/test_proxy.py",
    "tests/test_shutdown.py",
    "tests/topology/test_faults.py",
    "tests/topology/test_network.py",
    "tests/topology/test_cluster_failover.py",
    "tests/topology/test_redis_restart.py",
    "tests/topology/test_state_full.py",
    # Its quickstart pip-installs the project, rewriting the entry points that every process
    # starting beside it reads.
    "tests/test_readme.py",
}
# Modules whose tests share no server between them: xdist may hand each test to either worker,
# where it would otherwise keep the whole module on one (the scheduler below).
SPLIT = ("tests/app/test_schemathesis.py::",)
# The longest modules, first: the parallel pass hands modules out in this order, and a long
# one handed out last keeps one worker busy while the other has nothing left to do.
LONGEST_FIRST = (
    "tests/app/test_schemathesis.py",
    "tests/app/test_model_lifecycle.py",
    "tests/registry/test_approximate.py",
    "tests/examples/test_third_party_plugin.py",
    "tests/topology/test_cache_redis.py",
    "tests/families/task_heads/test_arch_bert_variants.py",
    "tests/topology/test_leases.py",
    "tests/app/test_decisions_contract.py",
    "tests/topology/test_proxy.py",
)
# A module that names any of these starts processes (servers, workers, the CLI), and so does a
# test that asks for one of the fixtures after it: not `quick`.
_STARTS_PROCESSES = (
    "subprocess",
    "Server(",
    "start_server",
    "module_server",
    "start_worker",
    "topology",
    "procs",
)
_PROCESS_FIXTURES = {"shared_server", "minilm_server", "reranker_server", "redis_proc", "start_server"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`serial` for the modules above; `quick` for every test of a module that starts no
    process and is not marked slow (`pytest -m quick`, the inner loop); LONGEST_FIRST's
    modules moved to the front, each module's tests in their own order."""
    root = Path(str(config.rootpath))
    starts: dict[Path, bool] = {}
    for item in items:
        path = Path(str(item.path))
        if path not in starts:
            starts[path] = any(word in path.read_text() for word in _STARTS_PROCESSES)
        if path.relative_to(root).as_posix() in SERIAL:
            item.add_marker(pytest.mark.serial)
        uses = set(getattr(item, "fixturenames", ()))
        if not starts[path] and not uses & _PROCESS_FIXTURES and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.quick)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's loadscope (a module's tests on one worker, so its module-scoped servers start
    once), but SPLIT's modules are handed out test by test."""
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Scheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return nodeid if nodeid.startswith(SPLIT) else str(super()._split_scope(nodeid))

    return Scheduling(config, log)


@pytest.fixture(autouse=True, scope="session")
def _short_warm_up() -> Iterator[None]:
    """bfloat16 and int8 loads run a lone row of every token count up to 128 (their first oneDNN
    builds). In this process, without a server's thread policy, that took ~10 s a load on the
    shared machine, and these tests compare numbers, not first forwards: their in-process loads
    warm 4 counts (servers started as processes warm all; test_native_dense tests the full one)."""
    from vllm_srun.engines.native.engine import NativeModel

    before = NativeModel.warm_max_tokens
    NativeModel.warm_max_tokens = 4
    yield
    NativeModel.warm_max_tokens = before


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


@pytest.fixture(scope="session")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Server]]:
    """Like module_server, but one server per distinct argument list for the whole run (for
    each xdist worker), shared by every module that asks for the same one. Only for tests that
    read: none may change what a later test sees (its cache may fill, which changes no answer)."""
    servers: dict[tuple[str, ...], Server] = {}
    root = tmp_path_factory.mktemp("shared-server")

    def start(*args: str) -> Server:
        if args not in servers:
            servers[args] = Server(list(args), root / f"server-{len(servers)}.log").wait_ready()
        return servers[args]

    yield start
    for server in servers.values():
        server.stop()


@pytest.fixture(scope="session")
def minilm_server(shared_server: Callable[..., Server]) -> Server:
    """The real all-MiniLM-L6-v2 as one model named `all-MiniLM-L6-v2` and `minilm`."""
    return shared_server(str(minilm_dir()), "--served-model-name", "all-MiniLM-L6-v2", "minilm")


@pytest.fixture(scope="session")
def reranker_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random-weight bert-reranker fixture, written once for the run."""
    from vllm_srun.testing.task_heads_fixtures import write_fixture

    return write_fixture(tmp_path_factory.mktemp("shared-reranker") / "reranker", variant="bert-reranker")


@pytest.fixture(scope="session")
def reranker_server(shared_server: Callable[..., Server], reranker_package: Path) -> Server:
    """`reranker_package` as one model named `reranker` and `rerank-v3.5` (Cohere's name)."""
    return shared_server(str(reranker_package), "--served-model-name", "reranker", "rerank-v3.5")


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    """Processes a test starts itself: whatever is still running at its end is killed."""
    started: list[Proc] = []
    yield started
    for proc in started:
        proc.stop(signal.SIGKILL)
