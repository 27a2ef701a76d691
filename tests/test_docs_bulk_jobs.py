"""docs/bulk-jobs.md's "A job, line by line", against a real MiniLM server: its job files
submitted as the page submits them answer the page's lines. Vectors are compared on the
numbers the page keeps (its first three, then "…") within 1e-4, and ids and times on their
type only, since they are new for every job."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import REPO, Server, run_cli

HEADING = "## A job, line by line\n"
MODEL = "all-MiniLM-L6-v2"
# Fields that differ for every job: compared on their type.
PER_JOB = {"id", "created_at", "started_at", "finished_at", "expires_at"}


def blocks() -> list[str]:
    section = (REPO / "docs" / "bulk-jobs.md").read_text().split(HEADING, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```\n(.*?)```", section, re.S)


def lines(block: str) -> list[Any]:
    return [json.loads(line) for line in block.splitlines()]


def same(page: Any, served: Any, where: str = "") -> None:
    """`served` is what the page shows: a vector as its first numbers then "…"."""
    if isinstance(page, list) and page and page[-1] == "…":
        assert len(served) > len(page) - 1, where
        assert served[: len(page) - 1] == pytest.approx(page[:-1], abs=1e-4), where
    elif isinstance(page, dict):
        assert set(page) == set(served), (where, set(page) ^ set(served))
        for key, value in page.items():
            if key in PER_JOB:
                assert type(served[key]) is type(value), (where, key)
            else:
                same(value, served[key], f"{where}.{key}")
    elif isinstance(page, list):
        assert len(page) == len(served), where
        for i, (a, b) in enumerate(zip(page, served, strict=True)):
            same(a, b, f"{where}[{i}]")
    else:
        assert page == served, where


def post_job(server: Server, body: str, **params: str) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/jobs",
        params={"surface": "embeddings", "model": MODEL, **params},
        content=body,
        headers={"content-type": "application/x-ndjson"},
        timeout=60,
    )


def finished(server: Server, job: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        status = server.get(f"/v1/jobs/{job}").json()
        if status["status"] in ("completed", "failed", "cancelled"):
            return dict(status)
        assert time.monotonic() < deadline, status
        time.sleep(0.1)


def results(server: Server, job: str) -> list[Any]:
    got = server.get(f"/v1/jobs/{job}/results", headers={"accept": "application/x-ndjson"})
    assert got.status_code == 200, got.text
    return [json.loads(line) for line in got.text.splitlines()]


@pytest.mark.slow
def test_the_pages_job_lines(minilm_server: Server, tmp_path: Path) -> None:
    requests, cli_error, refused, recorded, status, more, accepted, more_results, page = blocks()
    # reject (the default): the CLI's line on stderr, exit 2; the route's 400.
    job_file = tmp_path / "requests.jsonl"
    job_file.write_text(requests)
    cli = run_cli(
        "jobs", "submit", str(job_file), "--model", MODEL, "--surface", "embeddings",
        "--url", minilm_server.url,
    )  # fmt: skip
    assert cli.returncode == 2 and cli.stderr.strip() == cli_error.strip(), cli
    answer = post_job(minilm_server, requests)
    assert answer.status_code == 400
    same(json.loads(refused), answer.json())
    # record: the bad line is its item's error.
    answer = post_job(minilm_server, requests, on_error="record")
    assert answer.status_code == 202, answer.text
    job = answer.json()["id"]
    shown, got = json.loads(status), finished(minilm_server, job)
    # `cached` counts what earlier requests had sent: the page's run had sent these texts before.
    assert got["counts"] | {"cached": 0} == shown["counts"] | {"cached": 0}
    same(shown, got | {"counts": shown["counts"]})
    same(lines(recorded), results(minilm_server, job))
    # A check that needs the model fails with its line as it runs.
    answer = post_job(minilm_server, more, on_error="record")
    assert answer.status_code == 202, answer.text
    queued = answer.json()
    same(json.loads(accepted) | {"status": queued["status"]}, queued)
    job = queued["id"]
    finished(minilm_server, job)
    same(lines(more_results), results(minilm_server, job))
    same(json.loads(page), minilm_server.get(f"/v1/jobs/{job}/results", params={"limit": 1}).json())
