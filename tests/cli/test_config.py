"""`--models` files and router configurations: names and aliases, strict keys, and the
endpoint check finding a deployment served under an alias."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from vllm_srun.cli.config import CatalogDeployment, _by_name, _judge, models_file, router_models
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


ROUTER = """\
global:
  model_catalog:
    deployments:
      judge: {provider: model_runtime, artifact: /srv/nli, device: cpu}
      chat: {provider: openai, endpoint: "http://127.0.0.1:9"}
    system:
      decision_model: {deployment: judge}
routing:
  signals:
    decision:
      - name: kind
        question: {preset: domain}
      - name: topics
        deployment: judge
        question:
          type: set
          instructions: Which topics?
          labels: [{key: code, description: programming}, {key: math}]
          threshold: 0.3
        predicate: {gte: 0.5}
"""


def test_router_deployments_may_be_a_mapping_and_signals_bind_to_them(tmp_path: Path) -> None:
    from vllm_srun.cli.config import decision_signals

    path = tmp_path / "router.yaml"
    path.write_text(ROUTER)
    (only,) = router_models(path)
    assert (only.options.ref, only.options.name) == ("/srv/nli", "judge")
    kind, topics = decision_signals(path)
    assert (kind.name, kind.deployment.name, kind.question) == ("kind", "judge", {"preset": "domain"})
    assert topics.question["threshold"] == 0.3


@pytest.mark.parametrize(
    ("signal", "message"),
    [
        (
            "{name: s, question: {preset: domain, instructions: mine}}",
            "s: routing.signals.decision[2].question.instructions",
        ),
        ("{name: s, question: {preset: domain, type: noul, threshold: 0.2}}", "question.threshold"),
        ("{name: s, question: {type: set, instructions: x, criteria: {}}}", "question.criteria"),
        (
            "{name: s, question: {type: set, instructions: x, criteria: {a: b}, threshold: 3}}",
            "question.threshold",
        ),
        (
            "{name: s, deployment: chat, question: {preset: domain}}",
            "'chat' is not a model_runtime deployment",
        ),
    ],
)
def test_a_malformed_decision_signal_stops_the_start(tmp_path: Path, signal: str, message: str) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(ROUTER + f"      - {signal}\n")
    with pytest.raises(ConfigError, match=re.escape(message)):
        router_models(path)


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
