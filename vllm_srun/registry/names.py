"""The name a model package calls its model: what a local folder is served under by default.

A sentence-transformers package (modules.json) names its model in its model card's title
(`# all-MiniLM-L6-v2`); any other package by config.json's `_name_or_path` (its basename).
A name that is missing, a path on the machine that wrote it, or several words gives None.
"""

from __future__ import annotations

import re

from vllm_srun.errors import PackageError
from vllm_srun.plugins.package import ModelPackage

# A Hub id's shape, org/ optional: the basename is what is served.
_ID = re.compile(r"(?:[A-Za-z0-9][\w.-]*/)?(?P<name>[A-Za-z0-9][\w.-]{0,95})")
# The part of a model card read for its title: titles come first, cards can be long.
_CARD_BYTES = 64 << 10


def own_name(package: ModelPackage) -> str | None:
    """The model's own name as its package states it, or None (see the module docstring)."""
    try:
        if package.exists("modules.json"):
            return _card_title(package)
        config = package.read_json("config.json") if package.exists("config.json") else None
    except (PackageError, OSError):
        return None
    written = config.get("_name_or_path") if isinstance(config, dict) else None
    return _basename(written) if isinstance(written, str) else None


def _card_title(package: ModelPackage) -> str | None:
    """The first `# Title` of README.md outside its YAML front matter, when it is one id."""
    if not package.exists("README.md"):
        return None
    text = package.read_bytes("README.md")[:_CARD_BYTES].decode("utf-8", errors="replace")
    lines = text.splitlines()
    if lines and lines[0].strip() == "---":  # front matter: its `# ...` lines are YAML comments
        end = next((i for i, line in enumerate(lines[1:], 1) if line.strip() == "---"), len(lines))
        lines = lines[end + 1 :]
    for line in lines:
        if line.startswith("```"):  # a code block's `# ...` is a comment, and titles come first
            return None
        if line.startswith("# "):
            return _basename(line[2:])
    return None


def _basename(written: str) -> str | None:
    match = _ID.fullmatch(written.strip())
    return match["name"] if match else None
