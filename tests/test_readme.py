"""The README's quickstart, run as written, over real HTTP."""

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
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                if httpx.get("http://127.0.0.1:8100/health", timeout=1).status_code == 200:
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
