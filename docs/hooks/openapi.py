"""A mkdocs hook: the OpenAPI reference page carries docs/openapi.json in itself, so that Redoc
draws it from `file://` too, where a browser refuses to fetch a sibling file (mkdocs.yml)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PAGE = "api/reference.md"
CONTAINER = '<div id="redoc-container"></div>'


def embedded(document_text: str) -> str:
    """The document as a JSON data block; `</` escaped so that no text in it ends the block."""
    text = json.dumps(json.loads(document_text), separators=(",", ":")).replace("</", "<\\/")
    return f'<script type="application/json" id="openapi-document">{text}</script>'


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri != PAGE:
        return html
    if CONTAINER not in html:
        raise ValueError(f"{PAGE} has no {CONTAINER} to draw the reference in")
    document = Path(config["docs_dir"], "openapi.json").read_text(encoding="utf-8")
    return html.replace(CONTAINER, CONTAINER + embedded(document), 1)
