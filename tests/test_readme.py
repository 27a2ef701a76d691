"""The README's quickstart, run as written, over real HTTP; the README is the front page (at most
200 lines, its two set-up commands and a compose block that works as it reads), and what it held
before lives on the documentation site's pages (tests/test_docs_site.py builds them)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from helpers import REPO


def quickstart_block() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text.split("## Quickstart: a third-party plugin", 1)[1]
    block = re.search(r"```\n(.*?)```", section, re.S)
    assert block is not None, "the README has no quickstart block"
    return block.group(1).splitlines()


def split_commands(lines: list[str]) -> tuple[str, str, str, str]:
    """(setup, serve, request, plugins): the block cut where the server must keep running."""
    serve_at = next(i for i, line in enumerate(lines) if line.startswith("vllm-srun serve"))
    plugins_at = next(i for i, line in enumerate(lines) if line.startswith("vllm-srun plugins"))
    setup = "\n".join(lines[:serve_at])
    request = "\n".join(lines[serve_at + 1 : plugins_at])
    return setup, lines[serve_at], request, lines[plugins_at]


def bash(script: str, timeout_s: float = 600) -> str:
    result = subprocess.run(
        ["bash", "-ec", script], cwd=REPO, capture_output=True, text=True, timeout=timeout_s
    )
    assert result.returncode == 0, f"{script}\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.mark.slow
def test_quickstart_as_written(tmp_path: Path) -> None:
    setup, serve, request, plugins = split_commands(quickstart_block())
    assert setup.startswith("pip install . ./examples/third_party_plugin")
    bash(setup)
    log = (tmp_path / "serve.log").open("wb")
    server = subprocess.Popen(
        ["bash", "-c", f"exec {serve}"],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    port = re.search(r"--port (\d+)", serve).group(1)  # the README's own port
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.2)
        answer = json.loads(bash(request, 60))
        assert [r["label"] for r in answer["results"]] == ["billing", "shipping"]
        listing = bash(plugins, 60)
        sections = dict(re.findall(r"^(\w+):\n((?:  .*\n)*)", listing, re.M))
        assert "example_keywords" in sections["families"]
        assert "example_counts" in sections["engines"]
        assert "example_host" in sections["accelerators"] and "cpu" in sections["accelerators"]
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=20)
        log.close()


README_LINES = 200
# Where the README's sections moved (docs/): a sentence of each, found there verbatim.
MOVED = {
    "getting-started.md": [
        "Without `--redis`, `serve` starts a private `redis-server`",
        "- Result cache: shared by",
    ],
    "models.md": ["| architecture (`model_type`) | classes | surfaces | example hub models |"],
    "api/index.md": ["| route | body |", "a web page cannot post to it without a CORS"],
    "coming-from/tei.md": ["| TEI `POST /embed` | same |", "TEI's routes answer errors in TEI's shape"],
    "coming-from/vllm.md": ["| vLLM `POST /score`, `/v1/score` |"],
    "coming-from/infinity.md": ['| Infinity, `infinity_client.Client(base_url=".../infinity")` |'],
    "coming-from/openai.md": ["| OpenAI `embeddings.create`", "**langchain-openai**"],
    "coming-from/cohere.md": ["| Cohere `ClientV2.rerank`"],
    "router.md": ["## Managed mode", "## Upstream contract 2.3.0"],
    "bulk-jobs.md": ["vllm-srun jobs submit requests.jsonl"],
    "deployment.md": [
        "**Two Redis roles.**",
        "**A cluster: `kubectl apply -k deploy/kubernetes/base`.**",
        "## Secrets",
    ],
    "performance.md": ["## Benchmark", "- **Intra-op threads**"],
    "plugins/index.md": ["Entry-point groups `vllm_srun.families`"],
    "development.md": ["`bash .ci/run` installs the project"],
}


def readme_blocks(heading: str) -> list[list[str]]:
    section = (REPO / "README.md").read_text().split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return [block.splitlines() for block in re.findall(r"```\n(.*?)```", section, re.S)]


def test_the_readme_is_a_front_page() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= README_LINES
    # The two commands: the server on its embedded default, and the tests.
    (serve,), (tests,) = readme_blocks("Set up")
    assert serve.startswith("pip install torch==") and serve.endswith("vllm-srun serve /tmp/kw")
    assert tests == "bash .ci/run"
    # Every link into the docs names a page that exists.
    for target in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (REPO / target).is_file(), target


def test_the_readmes_compose_block_is_up_the_key_and_a_curl() -> None:
    (block,) = readme_blocks("Run it with compose")
    up, key, curl = block
    assert up == "docker compose up"
    # The key command runs where compose puts the key file (tests/topology/test_compose_secrets.py
    # runs `vllm-srun api-key` with that service's environment).
    assert key == "docker compose exec -T app vllm-srun api-key"
    assert curl.startswith("curl -s localhost:8000/") and f"Bearer $({key})" in curl


def test_what_the_readme_held_is_on_the_docs_pages() -> None:
    for page, sentences in MOVED.items():
        text = (REPO / "docs" / page).read_text()
        for sentence in sentences:
            assert sentence in text, (page, sentence)
