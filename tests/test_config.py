"""`--models` files and router configurations: names and aliases, strict keys, and the
endpoint check finding a deployment served under an alias."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_srun.config import CatalogDeployment, _by_name, _judge, models_file, router_models
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


def test_a_router_deployment_serves_under_its_model_name_and_aliases(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(
        "global:\n  model_catalog:\n    deployments:\n"
        "      - name: embed-a\n        provider: model_runtime\n        artifact: /srv/minilm\n"
        "        model: minilm\n        aliases: [all-MiniLM-L6-v2]\n        router_only_key: 1\n"
        "      - name: elsewhere\n        provider: other\n        artifact: /srv/x\n"
    )
    (only,) = router_models(path)
    assert (only.options.ref, only.options.name, only.options.aliases) == (
        "/srv/minilm",
        "minilm",
        ("all-MiniLM-L6-v2",),
    )


def test_the_endpoint_check_finds_a_deployment_served_under_an_alias() -> None:
    listed = [{"id": "all-MiniLM-L6-v2", "aliases": ["minilm"], "device": "cpu", "state": "ready"}]
    deployment = CatalogDeployment(name="d", model="minilm", endpoint="http://x", device="cpu")
    check = _judge(deployment, _by_name(listed))
    assert check.ok, check.detail
    missing = _judge(CatalogDeployment(name="d", model="other", endpoint="http://x"), _by_name(listed))
    assert not missing.ok and missing.detail.endswith("it serves: all-MiniLM-L6-v2 on cpu (ready)")
