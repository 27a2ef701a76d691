"""Issue 22, L3: the documentation pages render with no network. Their scripts and styles come
from the package (vllm_srun/app/vendored), under a content-security policy that allows this
server's origin alone; a real headless Chromium, with its background networking off and no
internet on the machine, renders the operations of the document. /docs (the reference) and
/docs/swagger (to try a request) link each other, and list each route once, under its tag."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from helpers import Server, write_keywords

from vllm_srun.app.docs import CSP

PAGES = ("/docs", "/docs/redoc", "/docs/swagger")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def server(module_server: Callable[..., Server], tmp_path_factory: pytest.TempPathFactory) -> Server:
    return module_server(str(write_keywords(tmp_path_factory.mktemp("docs") / "keywords")))


@pytest.mark.parametrize("page", PAGES)
def test_pages_load_nothing_from_another_origin(server: Server, page: str) -> None:
    answer = server.get(page)
    assert answer.status_code == 200
    assert answer.headers["content-security-policy"] == CSP
    assert "script-src 'self'" in CSP and "unsafe-inline" not in CSP.split("script-src")[1].split(";")[0]
    sources = re.findall(r'<(?:script|link)\b[^>]*?(?:src|href)="([^"]+)"', answer.text)
    assert sources and all(s.startswith("/docs/static/") for s in sources), sources
    assert "<script>" not in answer.text  # no inline script: the policy would refuse it
    links = re.findall(r'<a href="([^"]+)"', answer.text)
    assert links and all(link.startswith("/") for link in links), links
    for source in sources + links:
        assert server.get(source).status_code == 200, source


def test_the_reference_and_swagger_ui_link_each_other(server: Server) -> None:
    assert '<a href="/docs/swagger">' in server.get("/docs").text
    assert '<a href="/docs/swagger">' in server.get("/docs/redoc").text
    assert '<a href="/docs">' in server.get("/docs/swagger").text


def test_pages_without_a_pinned_build_are_not_served(server: Server) -> None:
    for page in ("/docs/elements", "/docs/rapidoc"):
        assert server.get(page).status_code == 404, page


def render(url: str, profile: Path) -> str:
    """The DOM Chromium builds for `url` once its scripts have run (virtual time: no sleeping)."""
    assert CHROMIUM is not None
    args = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=15000",
        "--dump-dom",
        url,
    ]
    return subprocess.run(args, capture_output=True, text=True, timeout=120, check=True).stdout


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium)")
def test_a_browser_renders_the_operations(server: Server, tmp_path: Path) -> None:
    document = httpx.get(server.url + "/openapi.json", timeout=30).json()
    operations = [(m, p, op) for p, item in document["paths"].items() for m, op in item.items()]
    tag_of = {op["operationId"]: op["tags"][0] for _, _, op in operations}
    assert len(tag_of) == len(operations) > 10
    # Deep-linked to one operation, which Swagger UI opens ready to send (an Execute button).
    swagger = render(server.url + "/docs/swagger#/Surfaces/V1ClassifyClassify", tmp_path / "swagger")
    shown = re.findall(r'id="operations-(?!tag-)([^"-]+)-([^"]+)"', swagger)
    assert sorted(shown) == sorted((tag.replace(" ", "_"), op) for op, tag in tag_of.items())
    assert swagger.count('class="btn execute') == 1
    # Redoc's sidebar: each operation once, under its tag, named by its method and path.
    redoc = render(server.url + "/docs", tmp_path / "redoc")
    items = re.findall(r'data-item-id="tag/([^/"]+)/operation/([^"]+)"[^>]*aria-label="([^"]+)"', redoc)
    assert sorted((op, tag) for tag, op, _ in items) == sorted(
        (op, t.replace(" ", "-")) for op, t in tag_of.items()
    )
    assert sorted(label for _, _, label in items) == sorted(p for _, p, _ in operations)
