"""What `serve` says as it starts: one JSON format for every line (uvicorn's too), each model's
loading and warm-up steps with their durations, and `listening` only once the models are
loaded, never for a start it refuses."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from helpers import Server, run_cli, write_keywords


def lines(text: str) -> list[dict]:
    """Every line of a log, each a JSON object (a plain line fails here)."""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_a_refused_start_exits_without_announcing_listening(tmp_path: Path) -> None:
    empty = tmp_path / "emptydir"
    empty.mkdir()
    result = run_cli("serve", str(empty), "--port", "0", timeout=60)
    assert result.returncode != 0, result.stderr
    logged = lines(result.stderr)
    assert not [line for line in logged if line["event"] == "listening"], result.stderr
    # uvicorn's own lines, rendered as ours, say that the server is exiting.
    uvicorn = [line["event"] for line in logged if line.get("logger") == "uvicorn.error"]
    assert "Application startup failed. Exiting." in uvicorn, result.stderr
    refused = next(line for line in logged if line["event"] == "model_refused")
    assert refused["model"] == "emptydir" and "task_heads looks for config.json" in refused["reason"]


def test_listening_follows_each_models_steps(start_server: Callable[..., Server], tmp_path: Path) -> None:
    server = start_server(str(write_keywords(tmp_path / "kw")))
    logged = lines(server.log())
    events = [line["event"] for line in logged]
    assert events.count("listening") == 1, events
    listening = events.index("listening")
    assert events.index("model_ready") < listening
    assert logged[listening]["models"] == {"kw": "ready"}
    assert logged[listening]["url"] == server.url
    steps = [(line["event"], line["step"]) for line in logged if line["event"].startswith("model_step")]
    assert steps == [
        ("model_step", "loading"),
        ("model_step_done", "loading"),
        ("model_step", "warming: determinism check"),
        ("model_step_done", "warming: determinism check"),
    ]
    assert all(line["s"] >= 0 and line["dtype"] for line in logged if line["event"] == "model_step_done")
    assert any(line.get("logger") == "uvicorn.error" for line in logged)
