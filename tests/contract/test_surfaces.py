"""A real server on the fixtures keeps upstream's contract on every surface it defines: a
success, a per-item (or per-question) error and a request error each, over real HTTP, each
response checked against tests/contract/schema.py here, whatever hook.ENFORCE says."""

from __future__ import annotations

import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from contract.validator import check
from helpers import Server

LONG = " ".join(["the movie was good and the actors were great"] * 40)  # past the fixtures' 128 positions
QUESTIONS = {
    "topic": {
        "type": "choice",
        "instructions": "What is it about?",
        "criteria": {"films": "films", "food": "food"},
    },
    "good": {"type": "noul", "instructions": "Is it positive?"},
    "level": {"type": "score", "instructions": "How positive?", "levels": ["bad", "fine", "great"]},
}
BAD_QUESTION = {"type": "ask", "instructions": "Which?"}
# Upstream's newer question forms: a set over ordered labels, and presets the model defines.
SET_QUESTION = {
    "type": "set",
    "instructions": "Which are mentioned?",
    "labels": [{"key": "films", "description": "films"}, {"key": "food", "description": None}],
    "threshold": 0.4,
}
PRESETS = {"domain": {"preset": "domain"}, "topics": {"preset": "topics"}}


@pytest.fixture(scope="module")
def server(module_server: Callable[..., Server], tmp_path_factory: pytest.TempPathFactory) -> Server:
    from vllm_srun.testing.nli_fixtures import write_fixture as write_nli
    from vllm_srun.testing.task_heads_fixtures import write_fixture

    root = tmp_path_factory.mktemp("contract")
    packages = {
        "cls": write_fixture(root / "cls", variant="bert-sequence"),
        "tok": write_fixture(root / "tok", variant="bert-token"),
        "emb": write_fixture(root / "emb", variant="bert-embedding"),
        "rr": write_fixture(root / "rr", variant="bert-reranker"),
        "judge": write_nli(root / "judge", variant="bert"),
    }
    entries = "".join(
        f"  - model: {path}\n    name: {name}\n    device: cpu\n" for name, path in packages.items()
    )
    models = root / "models.yaml"
    models.write_text("models:\n" + entries)
    return module_server("--models", str(models))


def exchange(server: Server, method: str, path: str, body: Any = None) -> httpx.Response:
    """The response, once it is checked against upstream's contract (an assertion names every violation)."""
    if method == "GET":
        response = server.get(path)
    else:
        response = server.post(path, body)
    violations = check(method, path, response.status_code, response.content, response.headers)
    assert violations == [], "\n".join(violations)
    return response


def item_errors(results: list[dict[str, Any]]) -> list[Any]:
    return [r["error"] for r in results if "error" in r]


def test_classify(server: Server) -> None:
    ok = exchange(server, "POST", "/v1/classify", {"model": "cls", "input": ["good film", "bad film"]})
    assert ok.status_code == 200 and not item_errors(ok.json()["results"])
    spans = exchange(
        server,
        "POST",
        "/v1/classify",
        {"model": "tok", "input": "John lives in Paris", "options": {"return_tokens": True}},
    )
    assert spans.status_code == 200 and spans.json()["kind"] == "token"
    windowed = {
        "model": "cls",
        "head": "sequence",
        "input": LONG,
        "options": {"overflow": "window", "window": {"tokens": 32, "overlap": 4}},
    }
    windows = exchange(server, "POST", "/v1/classify", windowed).json()["results"][0]
    assert len(windows["windows"]) == windows["input"]["windows"] > 1
    failed = exchange(server, "POST", "/v1/classify", {"model": "cls", "input": [LONG, "good film"]})
    assert failed.status_code == 200 and item_errors(failed.json()["results"]) == ["max_length_exceeded"]
    assert exchange(server, "POST", "/v1/classify", {"model": "nope", "input": "x"}).status_code == 404
    assert exchange(server, "POST", "/v1/classify", {"model": "cls", "input": 5}).status_code == 400
    # A model kind not served here (a grounded head) is refused with upstream's error, never ignored.
    grounded = {"model": "cls", "input": [{"context": "c", "question": "q", "answer": "a"}]}
    assert exchange(server, "POST", "/v1/classify", grounded).status_code == 422


def test_embeddings(server: Server) -> None:
    ok = exchange(server, "POST", "/v1/embeddings", {"model": "emb", "input": ["good film", "bad film"]})
    assert ok.status_code == 200 and len(ok.json()["data"]) == 2
    b64 = exchange(
        server, "POST", "/v1/embeddings", {"model": "emb", "input": "x", "encoding_format": "base64"}
    )
    assert b64.status_code == 200 and isinstance(b64.json()["data"][0]["embedding"], str)
    meta = {"model": "emb", "input": "good film", "options": {"return_meta": True}}
    assert exchange(server, "POST", "/v1/embeddings", meta).json()["meta"]["representation"]["layer"] >= 1
    early = exchange(server, "POST", "/v1/embeddings", {**meta, "layer": 1}).json()
    assert early["meta"]["representation"]["layer"] == 1
    long = {"model": "emb", "input": [LONG, "good film"], "options": {"overflow": "reject"}}
    failed = exchange(server, "POST", "/v1/embeddings", long)
    assert failed.status_code == 200 and item_errors(failed.json()["data"]) == ["max_length_exceeded"]
    assert exchange(server, "POST", "/v1/embeddings", {"model": "nope", "input": "x"}).status_code == 404
    assert exchange(server, "POST", "/v1/embeddings", {"model": "emb", "input": []}).status_code == 400
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    # A modality the model lacks: the model's refusal, 422 unsupported_surface.
    assert exchange(server, "POST", "/v1/embeddings", {"model": "emb", "input": [image]}).status_code == 422


def test_rerank(server: Server) -> None:
    body = {"model": "rr", "query": "film", "documents": ["good film", "bad food"], "return_documents": True}
    ok = exchange(server, "POST", "/v1/rerank", body)
    assert ok.status_code == 200 and {r["document"] for r in ok.json()["results"]} == {
        "good film",
        "bad food",
    }
    failed = exchange(server, "POST", "/v1/rerank", {**body, "documents": [LONG, "good film"]})
    assert failed.status_code == 200 and item_errors(failed.json()["results"]) == ["max_length_exceeded"]
    assert exchange(server, "POST", "/v1/rerank", {**body, "model": "nope"}).status_code == 404
    assert exchange(server, "POST", "/v1/rerank", {**body, "documents": []}).status_code == 400


@pytest.mark.parametrize("path", ["/v1/decisions", "/v1/systemone"])
def test_decisions(server: Server, path: str) -> None:
    request = {"model": "judge", "state": {"request": "What a good film"}, "questions": QUESTIONS}
    ok = exchange(server, "POST", path, {**request, "options": {"return_meta": True}})
    assert ok.status_code == 200 and set(ok.json()["answers"]) == set(QUESTIONS)
    failed = exchange(server, "POST", path, {**request, "questions": {**QUESTIONS, "bad": BAD_QUESTION}})
    answers = failed.json()["answers"]
    assert failed.status_code == 200 and answers["bad"]["error"] == "invalid_question"
    assert "error" not in answers["good"]
    upstream = exchange(
        server, "POST", path, {**request, "questions": {"seen": SET_QUESTION, **PRESETS}}
    ).json()
    assert set(upstream["sets"]) == {"seen", "topics"} and "seen.films" in upstream["answers"]
    assert upstream["thresholds"]["seen"] == 0.4 and upstream["answers"]["domain"]["type"] == "choice"
    states = {**request, "states": {"other": {"state": "Bad food", "questions": {"good": QUESTIONS["good"]}}}}
    many = exchange(server, "POST", path, states)
    assert many.status_code == 200 and "good" in many.json()["states"]["other"]["answers"]
    assert exchange(server, "POST", path, {**request, "model": "nope"}).status_code == 404
    assert exchange(server, "POST", path, {**request, "questions": {}}).status_code == 400
    images = {**request, "images": ["data:image/png;base64,iVBORw0KGgo="]}
    assert exchange(server, "POST", path, images).status_code == 400


def test_bundle(server: Server) -> None:
    tasks = [
        {"id": "c", "classify": {"model": "cls", "input": ["good film", LONG]}},
        {"id": "e", "embeddings": {"model": "emb", "input": "good film"}},
        {"id": "r", "rerank": {"model": "rr", "query": "film", "documents": ["good film"]}},
        {"id": "d", "decisions": {"model": "judge", "state": "good film", "questions": QUESTIONS}},
        {"id": "missing", "classify": {"model": "nope", "input": "x"}},
    ]
    ok = exchange(server, "POST", "/v1/bundle", {"tasks": tasks})
    assert ok.status_code == 200
    statuses = {r["id"]: r["status"] for r in ok.json()["results"]}
    assert statuses == {"c": 200, "e": 200, "r": 200, "d": 200, "missing": 404}
    assert item_errors(ok.json()["results"][0]["classify"]["results"]) == ["max_length_exceeded"]
    assert exchange(server, "POST", "/v1/bundle", {"tasks": []}).status_code == 400


def test_models_and_health(server: Server) -> None:
    models = exchange(server, "GET", "/v1/models").json()
    assert {m["id"] for m in models["data"]} == {"cls", "tok", "emb", "rr", "judge"}
    assert exchange(server, "GET", "/health").status_code == 200
    assert exchange(server, "GET", "/health/live").status_code == 200
    assert exchange(server, "GET", "/metrics").status_code == 200


def test_health_not_ready(start_server: Callable[..., Server], tmp_path: Path) -> None:
    """503 while a model loads: still upstream's Health body."""
    from vllm_srun.testing.task_heads_fixtures import write_fixture

    package = write_fixture(tmp_path / "cls", variant="bert-sequence")
    models = tmp_path / "models.yaml"
    models.write_text(
        textwrap.dedent(f"""\
        models:
          - model: {package}
            name: cls
            device: cpu
        """)
    )
    server = start_server("--models", str(models), ready=False)
    seen: set[int] = set()
    deadline = time.monotonic() + 60
    while 200 not in seen:
        assert time.monotonic() < deadline, server.log()
        try:
            seen.add(exchange(server, "GET", "/health").status_code)
        except httpx.TransportError:
            assert server.alive(), server.log()
    assert seen <= {200, 503}
