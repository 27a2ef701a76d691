"""Router configurations: deployments served under their model name and aliases, and the
decision signals bound to them, a malformed one stopping the start."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vllm_srun.cli.router_config import decision_signals, router_models
from vllm_srun.errors import ConfigError


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
