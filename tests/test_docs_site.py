"""The documentation site (mkdocs.yml, docs/) builds offline with `mkdocs build --strict`, loads
nothing from another host (Material's Google Fonts off, the OpenAPI reference drawn by the Redoc
the server vendors) and works opened from `file://`, where the README says to open it: the
reference page carries its document, and search runs on Material's offline index."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from app.test_docs_offline import CHROMIUM, render
from helpers import REPO

pytest.importorskip("mkdocs", reason="the docs extra: pip install '.[docs]'")
pytest.importorskip("material", reason="the docs extra: pip install '.[docs]'")

# The pages a user looks for (issue 29), by their place in the navigation.
PAGES = (
    "getting-started.md",
    "models.md",
    "api/index.md",
    "api/reference.md",
    "coming-from/tei.md",
    "coming-from/vllm.md",
    "coming-from/infinity.md",
    "coming-from/openai.md",
    "coming-from/cohere.md",
    "router.md",
    "bulk-jobs.md",
    "deployment.md",
    "performance.md",
    "plugins/index.md",
    "development.md",
)
# What loads another resource: a script, a stylesheet, an image, a frame, a font in CSS.
LOADS = re.compile(r'<(?:script|link|img|iframe|source)\b[^>]*?\b(?:src|href)="([^"]+)"')
CSS_LOADS = re.compile(r"""(?:@import\s+|url\()\s*['"]?([^'")\s]+)""")


def build(site: Path, root: Path = REPO) -> subprocess.CompletedProcess[str]:
    """`mkdocs build --strict` of `root`'s mkdocs.yml and docs/ into `site`."""
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1", "HOME": str(site.parent)},
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("docs-site") / "site"
    result = build(out)
    assert result.returncode == 0, result.stderr
    return out


def nav_pages(nav: list[object]) -> Iterator[str]:
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        if isinstance(value, list):
            yield from nav_pages(value)
        else:
            yield str(value)


def test_the_configuration_needs_no_network() -> None:
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    assert config["theme"]["name"] == "material" and config["theme"]["font"] is False
    # A plugin may fetch: only search and Material's offline plugin run, and the offline
    # plugin's iframe-worker shim is the vendored copy, not the one it would add from unpkg.
    assert config["plugins"] == ["search", "offline"]
    assert config["extra"]["polyfills"] == ["assets/vendored/iframe-worker/shim.js"]
    assert "repo_url" not in config, "Material would fetch the repository's facts from its host"
    listed = set(nav_pages(config["nav"]))
    assert set(PAGES) <= listed
    written = {str(p.relative_to(REPO / "docs")) for p in (REPO / "docs").rglob("*.md")}
    assert written == listed, written ^ listed
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {re.split(r"[<>=]", r)[0] for r in extras["docs"]} == {"mkdocs", "mkdocs-material"}
    assert "mkdocs build --strict" in (REPO / ".ci" / "run").read_text()


def test_no_page_loads_anything_from_another_host(site: Path) -> None:
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > len(PAGES)
    for page in pages:
        for source in LOADS.findall(page.read_text()):
            assert not re.match(r"(?:[a-z]+:)?//", source), (page.name, source)
    for sheet in site.rglob("*.css"):
        for source in CSS_LOADS.findall(sheet.read_text()):
            assert not re.match(r"(?:https?:)?//", source), (sheet.name, source)


def test_a_broken_link_fails_the_strict_build(tmp_path: Path) -> None:
    # A copy of the site's sources (links followed), one page with a link to nowhere.
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    with (tmp_path / "docs" / "models.md").open("a") as page:
        page.write("\n[gone](no-such-page.md)\n")
    result = build(tmp_path / "site", tmp_path)
    assert result.returncode != 0 and "no-such-page.md" in result.stderr


def test_the_openapi_reference_is_the_vendored_redoc_on_the_embedded_document(site: Path) -> None:
    page = (site / "api" / "reference.html").read_text()
    scripts = [s for s in LOADS.findall(page) if "redoc" in s or "openapi" in s]
    assert scripts == ["../assets/redoc/redoc.standalone.js", "../assets/openapi-site.js"]
    vendored = REPO / "vllm_srun" / "app" / "vendored" / "redoc" / "redoc.standalone.js"
    assert (site / "assets" / "redoc" / "redoc.standalone.js").read_bytes() == vendored.read_bytes()
    # The document is in the page (a browser fetches no file from file://), and still beside it.
    block = re.search(r'<script type="application/json" id="openapi-document">(.*?)</script>', page, re.S)
    assert block is not None
    assert json.loads(block.group(1)) == json.loads((REPO / "docs" / "openapi.json").read_text())
    assert (site / "openapi.json").read_text() == (REPO / "docs" / "openapi.json").read_text()
    assert not (site / "hooks").exists(), "the build's hook is not a page of the site"


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium)")
def test_a_browser_renders_the_reference_from_file(site: Path, tmp_path: Path) -> None:
    document = json.loads((REPO / "docs" / "openapi.json").read_text())
    operation_ids = {op["operationId"] for item in document["paths"].values() for op in item.values()}
    dom = render((site / "api" / "reference.html").as_uri(), tmp_path)
    assert "Something went wrong" not in dom
    shown = set(re.findall(r'operation/([A-Za-z0-9_]+)"', dom))
    assert shown == operation_ids, operation_ids ^ shown


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium)")
def test_search_works_from_file(site: Path, tmp_path: Path) -> None:
    # Material opens its search on the `q` parameter; from file:// its worker runs only through
    # the offline plugin's inlined index and the iframe-worker shim.
    dom = render((site / "index.html").as_uri() + "?q=noeviction", tmp_path)
    found = set(re.findall(r'<a href="([^"#]+)[^"]*" class="md-search-result__link"', dom))
    assert (site / "deployment.html").as_uri() in found, found
