"""/v1/decisions in the upstream runtime's contract (2.3.0), over real HTTP on a tiny NLI model.

Set questions answer exactly the noul questions of their labels; a preset answers exactly the
question it names; `usage` counts the tokens of every (state, hypothesis) pair, per state;
failed questions carry an ItemError code and a message only; fields of model kinds not run
here are refused. A router configuration with preset and set decision signals is served by
`serve --config` and checked by `check-config`.
"""

from __future__ import annotations

import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import Server, run_cli
from tokenizers import Tokenizer

from vllm_srun.families.nli_decisions import templates
from vllm_srun.families.nli_decisions.presets import PRESETS
from vllm_srun.plugins.decision_bodies import parse_question, parse_state

STATE = {"context": "support chat", "request": "Write a Python function that merges two sorted lists."}
TOPICS = {"code": "programming", "math": "mathematics", "travel": None}
SET = {"type": "set", "instructions": "Which topics does the request touch?", "criteria": TOPICS}


@pytest.fixture(scope="module")
def nli(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from vllm_srun.testing.nli_fixtures import write_fixture

    return write_fixture(tmp_path_factory.mktemp("nli") / "judge", variant="bert")


@pytest.fixture(scope="module")
def server(module_server: Callable[..., Server], nli: Path) -> Server:
    return module_server(str(nli), "--device", "cpu")


def decide(server: Server, body: dict[str, Any]) -> dict[str, Any]:
    response = server.post("/v1/decisions", body)
    assert response.status_code == 200, response.text
    out: dict[str, Any] = response.json()
    return out


def test_a_set_answers_what_its_labels_asked_as_nouls_answer(server: Server) -> None:
    nouls = {
        label: {
            "type": "noul",
            "instructions": SET["instructions"],
            "criteria": {"true": description or label},
        }
        for label, description in TOPICS.items()
    }
    body = decide(server, {"state": STATE, "questions": {"t": SET, **nouls}})
    probabilities = body["sets"]["t"]["probabilities"]
    assert list(probabilities) == list(TOPICS)
    for label in TOPICS:
        assert body["answers"][f"t.{label}"] == {"type": "noul", "noul": probabilities[label]}
        assert probabilities[label] == body["answers"][label]["noul"]
    assert body["thresholds"] == {"t": 0.5}
    assert body["sets"]["t"]["selected"] == [k for k, p in probabilities.items() if p >= 0.5]
    ordered = {"type": "set", "instructions": SET["instructions"], "threshold": 0.0}
    ordered["labels"] = [{"key": k, "description": d} for k, d in TOPICS.items()]
    again = decide(server, {"state": STATE, "questions": {"t": ordered}})
    assert again["sets"]["t"]["probabilities"] == probabilities
    assert again["sets"]["t"]["selected"] == list(TOPICS) and again["thresholds"] == {"t": 0.0}


def test_a_preset_answers_as_the_question_it_names(server: Server) -> None:
    presets = {name: {"preset": name} for name in PRESETS}
    by_name = decide(
        server, {"state": STATE, "questions": {**presets, "topics": {"preset": "topics", "threshold": 0.2}}}
    )
    explicit = decide(
        server, {"state": STATE, "questions": {**PRESETS, "topics": {**PRESETS["topics"], "threshold": 0.2}}}
    )
    for key in ("answers", "sets", "thresholds", "usage"):
        assert by_name[key] == explicit[key], key
    assert (
        by_name["answers"]["difficulty"]["type"] == "score"
        and 0 <= by_name["answers"]["difficulty"]["score"] <= 4
    )
    card = server.get("/v1/models").json()["data"][0]
    assert set(card["presets"]) == set(PRESETS) and "set" in card["question_types"]
    # Like any question, a preset may require the whole state read: the same answer, with proof.
    full = decide(
        server, {"state": STATE, "questions": {"domain": {"preset": "domain", "require_full_input": True}}}
    )
    assert full["answers"]["domain"].pop("input_coverage") == "complete"
    assert full["answers"]["domain"] == by_name["answers"]["domain"]


def test_usage_counts_every_pair_per_state(server: Server, nli: Path) -> None:
    tokenizer = Tokenizer.from_file(str(nli / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()

    def tokens(state: Any, questions: dict[str, Any]) -> int:
        text = parse_state(state).text
        return sum(
            len(tokenizer.encode(text, hypothesis).ids)
            for qid, raw in questions.items()
            for hypothesis in templates.hypotheses(parse_question(qid, raw, qid))
        )

    later = {"n": {"type": "noul", "instructions": "Is the user polite?"}}
    body = decide(
        server,
        {
            "state": STATE,
            "questions": {"t": SET},
            "states": {"later": {"state": "thanks!", "questions": later}},
        },
    )
    assert body["usage"] == {"input_tokens": tokens(STATE, {"t": SET}), "output_tokens": 0}
    later_body = body["states"]["later"]
    assert later_body["usage"] == {"input_tokens": tokens("thanks!", later), "output_tokens": 0}
    assert later_body["model"] == body["model"] and set(later_body["answers"]) == {"n"}


def test_failed_questions_carry_an_item_error_code_and_a_message(server: Server) -> None:
    long_state = " ".join(["the movie was good"] * 60)
    questions = {
        "unknown": {"type": "ask", "instructions": "?"},
        "span": {"type": "span", "instructions": "Names?", "criteria": {"person": "a person"}},
        "extra": {"preset": "domain", "instructions": "mine"},
        "missing": {"preset": "nope"},
        "window": {"type": "noul", "instructions": "x", "overflow": "window"},
        "ok": {"type": "noul", "instructions": "Is it a question?"},
    }
    body = decide(server, {"state": "hello", "questions": questions})
    for qid in ("unknown", "span", "extra", "missing", "window"):
        answer = body["answers"][qid]
        assert set(answer) == {"type", "error", "message"} and answer["error"] == "invalid_question", answer
        assert answer["message"].startswith(f"questions.{qid}."), answer
    assert body["answers"]["unknown"]["type"] is None and body["answers"]["span"]["type"] == "span"
    assert "instructions" in body["answers"]["extra"]["message"]
    too_long = decide(server, {"state": long_state, "questions": {"ok": questions["ok"]}})
    assert too_long["answers"]["ok"]["error"] == "max_length_exceeded"
    full = {**questions["ok"], "require_full_input": True}
    proved = decide(server, {"state": "hello", "questions": {"ok": full}})
    assert proved["answers"]["ok"]["input_coverage"] == "complete"
    cut = decide(
        server, {"state": long_state, "questions": {"ok": full}, "options": {"overflow": "truncate"}}
    )
    assert cut["answers"]["ok"]["error"] == "max_length_exceeded"


@pytest.mark.parametrize(
    ("extra", "param", "status", "code"),
    [
        # Upstream's DecisionImages: a model without the modality answers invalid_request.
        ({"images": ["data:image/png;base64,iVBORw0KGgo="]}, "images", 400, "invalid_request"),
        # A scan budget this model does not have: its refusal.
        ({"options": {"max_tokens": 64}}, "options.max_tokens", 422, "unsupported_surface"),
    ],
)
def test_fields_of_model_kinds_not_run_here_are_refused(
    server: Server, extra: dict[str, Any], param: str, status: int, code: str
) -> None:
    response = server.post("/v1/decisions", {"state": "hello", "questions": {"q": SET}, **extra})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["param"] == param and error["message"].startswith(param)


def router_yaml(judge: str, signals: str) -> str:
    """A router config whose one model_runtime deployment, `judge` (its `artifact` or
    `endpoint` given as `judge`), answers the decision `signals` (a `routing:` block)."""
    header = f"""\
        global:
          model_catalog:
            deployments:
              judge: {{provider: model_runtime, {judge}, device: cpu}}
            system:
              decision_model: {{deployment: judge}}
        """
    return textwrap.dedent(header) + textwrap.dedent(signals)


def cli(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, timeout=timeout)


def test_a_router_config_with_presets_and_sets_serves_and_checks(
    start_server: Callable[..., Server], tmp_path: Path, nli: Path
) -> None:
    signals = """\
        routing:
          signals:
            decision:
              - name: kind
                question: {preset: domain}
              - name: topics
                deployment: judge
                question:
                  type: set
                  instructions: Which topics does the request touch?
                  labels: [{key: code, description: programming}, {key: math}]
                  threshold: 0.3
              - name: hard
                question: {preset: difficulty}
                predicate: {gte: 2}
        """
    served = tmp_path / "router.yaml"
    served.write_text(router_yaml(f'artifact: "{nli}"', signals))
    server = start_server("--config", str(served))
    assert (
        "choice"
        in decide(server, {"model": "judge", "state": "hi", "questions": {"k": {"preset": "domain"}}})[
            "answers"
        ]["k"]
    )
    checked = tmp_path / "check.yaml"
    checked.write_text(
        router_yaml(f'endpoint: "{server.url}"', signals)
        + "      - {name: odd, question: {preset: colour}}\n"
    )
    result = cli("check-config", str(checked), timeout=60)
    lines = result.stdout.splitlines()
    assert result.returncode == 1, result.stdout + result.stderr
    assert lines[0].startswith("ok   judge @")
    assert lines[1].startswith("ok   decision kind") and "(choice)" in lines[1]
    assert lines[2].startswith("ok   decision topics") and "(set)" in lines[2]
    assert lines[3].startswith("ok   decision hard") and "(score)" in lines[3]
    assert lines[4].startswith("FAIL decision odd") and "colour" in lines[4]
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        served.read_text() + "      - {name: bad, question: {preset: domain, levels: [a, b]}}\n"
    )
    refused = cli("check-config", str(broken), timeout=60)
    assert refused.returncode == 2 and "bad: routing.signals.decision[3].question.levels" in refused.stderr


@pytest.mark.parametrize(
    ("signal", "message"),
    [
        ("{name: odd, question: {preset: nope}}", "question.preset: 'nope' is not a preset of this model"),
        (
            "{name: odd, question: {preset: domain, threshold: 0.3}}",
            "question.threshold: preset 'domain' is a choice question, not a set",
        ),
    ],
)
def test_serve_config_stops_on_a_signal_its_own_model_cannot_answer(
    tmp_path: Path, nli: Path, signal: str, message: str
) -> None:
    # What only the loaded model knows (its presets and their types, its question types) is
    # checked once it has loaded: the start stops naming the signal, instead of a server whose
    # every router call for that signal gets invalid_question.
    router = tmp_path / "router.yaml"
    signals = f"""\
        routing:
          signals:
            decision:
              - name: kind
                question: {{preset: domain}}
              - {signal}
        """
    router.write_text(router_yaml(f'artifact: "{nli}"', signals))
    result = cli("serve", "--config", str(router), "--port", "0", timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("error: ") and "decision signal 'odd' (deployment 'judge')" in error, error
    assert message in error, error
