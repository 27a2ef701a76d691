"""/v1/models, /v1/models/{id}, /health and /health/live in the upstream contract's shapes
(ModelList, ModelCard, Health, Liveness), over real HTTP, on the fixtures: a sequence head, a
token head, an embedder, a reranker, an NLI decision model, and a model that failed."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from contract.validator import check
from helpers import Server

from vllm_srun import defaults
from vllm_srun.app.service.health import ModelState, overall
from vllm_srun.plugins.bodies import NUMERICS

HEAD_KINDS = {"sequence", "scores", "token"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    from vllm_srun.testing.nli_fixtures import write_fixture as write_nli
    from vllm_srun.testing.task_heads_fixtures import write_fixture

    root = tmp_path_factory.mktemp("cards")
    packages: dict[str, Path] = {
        "cls": write_fixture(root / "cls", variant="bert-sequence"),
        "tok": write_fixture(root / "tok", variant="bert-token"),
        "emb": write_fixture(root / "emb", variant="bert-embedding"),
        "rr": write_fixture(root / "rr", variant="bert-reranker"),
        "judge": write_nli(root / "judge", variant="bert"),
        "missing": root / "no-such-package",
    }
    models = root / "models.yaml"
    models.write_text(
        "models:\n"
        + "".join(f"  - model: {path}\n    name: {name}\n    device: cpu\n" for name, path in packages.items())
    )
    server = Server(["--models", str(models)], root / "server.log").wait_ready(path="/health/live")
    try:
        deadline = time.monotonic() + 120
        while any(
            m["status"] not in ("ready", "failed") for m in server.get("/health").json()["models"].values()
        ):
            assert time.monotonic() < deadline, server.log()[-3000:]
            time.sleep(0.2)
        yield server
    finally:
        server.stop()


def checked(server: Server, path: str) -> tuple[int, dict]:
    response = server.get(path)
    violations = check("GET", path, response.status_code, response.content, response.headers)
    assert violations == [], "\n".join(violations)
    return response.status_code, response.json()


@pytest.fixture(scope="module")
def cards(server: Server) -> dict[str, dict]:
    status, body = checked(server, "/v1/models")
    assert status == 200
    assert body["api_version"] == defaults.API_VERSION == "2.3.0" and body["object"] == "list"
    assert body["limits"] == {
        "max_bundle_tasks": defaults.MAX_BUNDLE_TASKS,
        "max_request_bytes": defaults.MAX_REQUEST_BYTES,
    }
    assert set(body["plugins"]) >= {"families", "engines", "accelerators"}  # ours, kept
    return {card["id"]: card for card in body["data"]}


def test_every_card_has_upstreams_identity_placement_and_state(cards: dict[str, dict]) -> None:
    assert sorted(cards) == ["cls", "emb", "judge", "missing", "rr", "tok"]
    for name in ("cls", "tok", "emb", "rr", "judge"):
        card = cards[name]
        assert (card["object"], card["owned_by"]) == ("model", "vllm-srun") and card["created"] > 0
        assert card["ready"] is True and card["status"] == card["state"] == "ready"
        assert re.fullmatch(r"[0-9a-f]{64}", card["model_sha256"])
        assert card["golden"]["status"] in ("matched", "unverified")
        assert (card["engine"], card["accelerator"], card["device"], card["dtype"]) == (
            "native",
            "cpu",
            "cpu",
            "float32",
        )
        # In `serve --help`'s words for --dtype float32 (tests/cli/test_help.py).
        exact = {"name": "exact", "numerics": "exact", "description": NUMERICS["float32"]}
        assert card["profile"] == "exact" and card["profiles"] == [exact]
        assert [(p["group"], p["name"]) for p in card["plugins"]] == [
            ("families", card["family"]),
            ("engines", "native"),
            ("accelerators", "cpu"),
        ]
        assert all(p["distribution"] == "vllm-srun" and p["version"] for p in card["plugins"])
        assert isinstance(card["plugins"][0]["capabilities"], dict)
        assert "repo" not in card and "revision" not in card  # local directories
        assert all(head["kind"] in HEAD_KINDS for head in card.get("heads", []))
        assert isinstance(card["limits"]["max_input_tokens"], int)


def test_classify_heads_are_head_cards(cards: dict[str, dict]) -> None:
    (head,) = cards["cls"]["heads"]
    assert head["kind"] == "sequence" and head["labels"] == ["negative", "neutral", "positive"]
    assert cards["tok"]["heads"][0]["kind"] == "token"
    assert cards["cls"]["limits"]["max_inputs"] == defaults.MAX_INPUTS
    assert cards["cls"]["surfaces"] == ["classify"] and "/v1/classify" in cards["cls"]["routes"]


def test_embedding_card(cards: dict[str, dict]) -> None:
    embedding = cards["emb"]["embedding"]
    assert set(embedding) >= {"dimensions", "layers", "modalities", "normalized", "pooling", "input_types"}
    assert embedding["dimensions"][-1] == embedding["dimension"] and embedding["modalities"] == ["text"]
    assert embedding["pooling"] == "mean" and isinstance(embedding["normalized"], bool)
    assert "question_types" not in cards["emb"] and "modalities" not in cards["emb"]
    # An embedder's pooled output is no classify head: it is listed with our other heads.
    assert all(head["kind"] in HEAD_KINDS for head in cards["emb"].get("heads", []))


def test_decision_model_card(cards: dict[str, dict]) -> None:
    judge = cards["judge"]
    assert judge["surfaces"] == ["decisions"] and judge["modalities"] == ["text"]
    assert {"choice", "noul", "score"} <= set(judge["question_types"])
    assert isinstance(judge["presets"], list)
    limits = judge["limits"]
    assert (limits["min_options"], limits["max_options"], limits["min_levels"], limits["max_levels"]) == (
        2,
        255,
        2,
        10,
    )
    assert "max_inputs" not in limits


def test_a_failed_model_card_says_why(cards: dict[str, dict]) -> None:
    missing = cards["missing"]
    assert missing["ready"] is False and missing["status"] == missing["state"] == "failed"
    assert "no-such-package" in missing["reason"]
    assert missing["golden"] == {"status": "unverified"} and missing["surfaces"] == []


def test_retrieve_answers_the_same_card(server: Server, cards: dict[str, dict]) -> None:
    status, card = checked(server, "/v1/models/judge")
    assert status == 200 and card == cards["judge"]
    assert server.get("/v1/models/nope").json()["error"]["code"] == "model_not_found"


def test_health_is_upstreams_with_our_states(server: Server) -> None:
    status, body = checked(server, "/health")
    assert status == 503 and body["api_version"] == "2.3.0"
    assert body["status"] == "degraded" and body["reason"].startswith("missing: ")
    assert body["models"]["cls"] == {"status": "ready"}
    assert body["models"]["missing"]["status"] == "failed" and body["models"]["missing"]["reason"]
    assert body["states"]["missing"] == "failed" and body["reasons"]["missing"] == body["models"]["missing"]["reason"]
    assert body["model"] is None  # several models: present, null (the dashboard probe reads it)
    status, live = checked(server, "/health/live")
    assert status == 200 and live == {"api_version": "2.3.0", "status": "alive"}


def state(status: str, reason: str | None = None) -> ModelState:
    return ModelState(status, status, reason)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [
        (["ready", "ready"], "ready"),
        (["ready", "loading"], "loading"),
        (["warming", "loading"], "loading"),
        (["ready", "warming"], "warming"),
        (["ready", "failed"], "degraded"),
        (["loading", "failed"], "degraded"),
        (["ready", "degraded"], "degraded"),
        (["failed", "failed"], "failed"),
    ],
)
def test_the_process_status_from_its_models(statuses: list[str], expected: str) -> None:
    status, reason = overall({f"m{i}": state(s, "why" if s == "failed" else None) for i, s in enumerate(statuses)})
    assert status == expected
    assert (reason is None) == (expected == "ready")
