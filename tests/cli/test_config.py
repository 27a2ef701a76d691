"""`--models` files: names and aliases, strict keys, the router's JSON form and its profiles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_srun.cli.config import models_file
from vllm_srun.errors import ConfigError


def test_a_models_entry_names_its_model_and_aliases(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text(
        "models:\n"
        "  - model: /srv/minilm\n    name: all-MiniLM-L6-v2\n"
        "    aliases: [sentence-transformers/all-MiniLM-L6-v2, minilm]\n"
        "  - model: acme/tiny\n"
    )
    first, second = (s.options for s in models_file(path))
    assert (first.name, first.aliases) == (
        "all-MiniLM-L6-v2",
        ("sentence-transformers/all-MiniLM-L6-v2", "minilm"),
    )
    assert (second.name, second.aliases) == (None, ())  # named when it resolves: acme/tiny


def test_a_misspelled_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text("models:\n  - model: /srv/minilm\n    alias: [minilm]\n")
    with pytest.raises(ConfigError, match="alias"):
        models_file(path)


def router_models_file(tmp_path: Path, **entry: str) -> Path:
    """A --models file as the router's supervisor writes one (JSON, `profile` always there)."""
    path = tmp_path / "r.models.json"
    base = {"model": "acme/tiny", "name": "tiny", "device": "cpu", "profile": "exact"}
    path.write_text(json.dumps({"models": [{**base, **entry}]}, indent=2) + "\n")
    return path


def test_the_routers_models_file_is_read_with_revision_and_profile(tmp_path: Path) -> None:
    (exact,) = models_file(router_models_file(tmp_path, revision="0123456789" * 4))
    assert (exact.options.ref, exact.options.name, exact.options.device) == (
        "acme/tiny@" + "0123456789" * 4,
        "tiny",
        "cpu",
    )
    assert exact.options.max_speed is False
    (fast,) = models_file(router_models_file(tmp_path, profile="max_speed"))
    assert fast.options.max_speed is True and fast.options.ref == "acme/tiny"
    (unset,) = models_file(router_models_file(tmp_path, profile=""))  # no profile: the default
    assert unset.options.max_speed is False


def test_an_unknown_profile_is_refused_naming_the_profiles(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"profile 'turbo' is not one of its profiles \(exact, max_speed\)"):
        models_file(router_models_file(tmp_path, profile="turbo"))
    path = tmp_path / "both.yaml"
    path.write_text("models:\n  - {model: acme/tiny, profile: exact, max_speed: true}\n")
    with pytest.raises(ConfigError, match="contradicts max_speed"):
        models_file(path)
