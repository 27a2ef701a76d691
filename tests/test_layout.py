"""The package's layout as docs/architecture.md describes it: its import contract, short
modules with short docstrings, no issue numbers in code, and a page naming only files that exist."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "vllm_srun"
MAX_LINES = 500
MAX_DOCSTRING_LINES = 8
# A module longer than MAX_LINES says why in one line near its top.
LONG_REASON = re.compile(r"longer than 500 lines", re.IGNORECASE)
# References that rot: an issue's number, a finding's label, a design file outside the repository.
ROTTING = re.compile(r"\bissues? #?\d+\b|\bDESIGN\.md\b|\(issue \d+, [A-Z]\d+\)", re.IGNORECASE)


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "static" not in p.parts)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(REPO)))
def test_module_is_short_with_a_short_docstring(path: Path) -> None:
    text = path.read_text()
    lines = text.splitlines()
    if len(lines) > MAX_LINES:
        head = "\n".join(lines[:12])
        assert LONG_REASON.search(head), (
            f"{path.relative_to(REPO)} has {len(lines)} lines (> {MAX_LINES}) and no one-line "
            "reason ('longer than 500 lines: ...') at its top"
        )
    docstring = ast.get_docstring(ast.parse(text)) or ""
    assert len(docstring.splitlines()) <= MAX_DOCSTRING_LINES, (
        f"{path.relative_to(REPO)}'s module docstring has {len(docstring.splitlines())} lines "
        f"(at most {MAX_DOCSTRING_LINES}: the design story belongs on the docs site)"
    )


def test_no_issue_numbers_or_outside_files_in_code() -> None:
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in _modules()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if ROTTING.search(line)
    ]
    assert not found, "references that will rot:\n" + "\n".join(found)


def test_import_contract_holds() -> None:
    """The layers and the absence of cycles, as `.importlinter` declares them (every import
    counts, those under TYPE_CHECKING and inside functions too)."""
    command = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    result = subprocess.run(
        [sys.executable, "-c", command, "--no-cache"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "BROKEN" not in result.stdout


def test_architecture_page_names_only_files_that_exist() -> None:
    page = (REPO / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"`(vllm_srun/[\w/]+\.(?:py|lua))", page))
    assert len(named) >= 20, "the page draws the request path file by file"
    missing = sorted(name for name in named if not (REPO / name).is_file())
    assert not missing, f"docs/architecture.md names files that do not exist: {missing}"
    functions = re.findall(r"`(vllm_srun/[\w/]+\.py):(\w+(?:\.\w+)?)`", page)
    for name, function in functions:
        tree = ast.parse((REPO / name).read_text())
        defined = {
            node.name
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        }
        assert function.split(".")[-1] in defined, f"docs/architecture.md: {name} defines no {function}"
