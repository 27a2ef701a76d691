"""The router's managed mode, as its supervisor runs us: `serve` started with the command line
the router builds (vllm-project/semantic-router, pkg/modelservice/process.go: `serve --models
<n>.models.json --uds <n>.sock --max-request-bytes 67108864 --max-bundle-tasks 1024
--cache-dir D --threads N`), its JSON models file, and every call over the unix socket alone.

Each response is read for the fields the router's client reads: /health's `reason` and
`model`, every rerank result's `logit`, and the provenance `meta` (model_id, revision,
model_sha256, engine, profile, numerics, accelerator; representation on embeddings) from a
built-in family and from the third-party example family alike.
"""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from contract.dashboard_probe import probe
from helpers import REPO, Proc, cache_package, run_cli, write_keywords

from vllm_srun.client import http_options

REVISION = "0123456789abcdef0123456789abcdef01234567"
# The router's own bounds for a managed process (process.go: ManagedRequestBytes, managedBundleTasks).
MANAGED_REQUEST_BYTES, MANAGED_BUNDLE_TASKS = 64 << 20, 1024
PROVENANCE = ("model_id", "model_sha256", "engine", "profile", "numerics", "accelerator")
QUESTIONS = {
    "urgent": {"type": "noul", "instructions": "Is this urgent?"},
    "topic": {
        "type": "choice",
        "instructions": "What is this about?",
        "criteria": {"billing": "money and invoices", "shipping": "parcels and delivery"},
    },
}


def managed_command(models_file: Path, socket: Path, cache_dir: Path, threads: int) -> list[str]:
    """The router's managedCommand, word for word, with this interpreter as the command."""
    return [
        sys.executable,
        "-m",
        "vllm_srun.cli",
        "serve",
        "--models",
        str(models_file),
        "--uds",
        str(socket),
        "--max-request-bytes",
        str(MANAGED_REQUEST_BYTES),
        "--max-bundle-tasks",
        str(MANAGED_BUNDLE_TASKS),
        "--cache-dir",
        str(cache_dir),
        "--threads",
        str(threads),
    ]


def wait_healthy(proc: Proc, client: httpx.Client, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.alive(), proc.log()
        try:
            if client.get("/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"not healthy in {timeout_s}s:\n{proc.log()}")


@pytest.fixture(scope="module")
def managed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Client, Path, Proc]]:
    from vllm_srun.testing.nli_fixtures import write_fixture as write_nli
    from vllm_srun.testing.task_heads_fixtures import write_fixture as write_task_heads

    root = tmp_path_factory.mktemp("managed")
    # A short private directory, as the router's (socket paths must stay under 108 bytes).
    runtime_dir = Path(f"/tmp/vsr-test-{os.getpid()}")
    runtime_dir.mkdir(mode=0o700, exist_ok=True)
    cache = root / "hub"
    # The plugin family's package as a repository in the --cache-dir cache, at a pinned revision.
    cache_package(cache, "acme/keywords", REVISION, write_keywords(root / "kw"))
    models = [
        {"model": "acme/keywords", "revision": REVISION, "name": "kw", "device": "cpu", "profile": "exact"},
        {
            "model": str(write_nli(root / "nli", variant="bert")),
            "name": "judge",
            "device": "cpu",
            "profile": "exact",
        },
        {
            "model": str(write_task_heads(root / "emb", variant="bert-embedding")),
            "name": "embedder",
            "device": "auto",
            "profile": "exact",
        },
        {
            "model": str(write_task_heads(root / "rr", variant="bert-reranker")),
            "name": "ranker",
            "device": "cpu",
            "profile": "exact",
        },
    ]
    models_file = runtime_dir / "kw-0123.models.json"
    models_file.write_text(json.dumps({"models": models}, indent=2) + "\n")
    models_file.chmod(0o600)
    socket = runtime_dir / "kw-0123.sock"
    proc = Proc(managed_command(models_file, socket, cache, threads=1), root / "serve.log")
    client = httpx.Client(**http_options(f"unix://{socket}", timeout_s=30.0))
    try:
        wait_healthy(proc, client)
        yield client, socket, proc
    finally:
        client.close()
        proc.stop()
        models_file.unlink(missing_ok=True)
        runtime_dir.rmdir()


def ok(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def provenance(meta: dict[str, Any], *, model: str, revision: str | None) -> None:
    for name in PROVENANCE:
        assert isinstance(meta.get(name), str) and meta[name], (name, meta)
    assert meta["model_id"] == model and meta.get("revision") == revision
    assert len(meta["model_sha256"]) == 64 and int(meta["model_sha256"], 16) >= 0
    assert (meta["profile"], meta["numerics"], meta["accelerator"]) == ("exact", "float32", "cpu")


def test_the_socket_is_the_owners_alone_and_no_port_is_opened(
    managed: tuple[httpx.Client, Path, Proc],
) -> None:
    _, socket, proc = managed
    mode = socket.stat().st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
    listening = [json.loads(line)["url"] for line in proc.log().splitlines() if '"listening"' in line]
    assert listening == [f"unix://{socket}"]


def test_health_carries_reason_and_model_and_models_the_limits(
    managed: tuple[httpx.Client, Path, Proc],
) -> None:
    client, _, _ = managed
    health = ok(client.get("/health"))
    assert health["status"] == "ready"
    # The dashboard probe reads both keys: present, null for a ready process of several models.
    assert "reason" in health and health["reason"] is None
    assert "model" in health and health["model"] is None
    assert set(health["models"]) == {"kw", "judge", "embedder", "ranker"}
    listed = ok(client.get("/v1/models"))
    cards = {m["id"]: m for m in listed["data"]}
    assert set(cards) == {"kw", "judge", "embedder", "ranker"}
    assert cards["kw"]["revision"] == REVISION and cards["kw"]["profile"] == "exact"
    assert listed["limits"] == {
        "max_bundle_tasks": MANAGED_BUNDLE_TASKS,
        "max_request_bytes": MANAGED_REQUEST_BYTES,
    }
    assert cards["embedder"]["device"] == "cpu"  # "auto", as `vllm-srun devices` says, on this host
    yaml_doc = client.get("/openapi.yaml")
    assert yaml_doc.status_code == 200 and yaml_doc.headers["content-type"].startswith("application/yaml")
    # The dashboard's serving-mode probe, over the socket the supervisor uses: a model engine.
    assert probe(client) == []


def test_decisions_and_classify_carry_provenance(managed: tuple[httpx.Client, Path, Proc]) -> None:
    client, _, _ = managed
    body = {"model": "judge", "state": "Where is my parcel?", "questions": QUESTIONS}
    answered = ok(client.post("/v1/decisions", json={**body, "options": {"return_meta": True}}))
    assert set(answered["answers"]) == {"urgent", "topic"}
    assert 0.0 <= answered["answers"]["urgent"]["noul"] <= 1.0
    assert answered["answers"]["topic"]["choice"] in ("billing", "shipping")
    provenance(answered["meta"], model="judge", revision=None)
    classified = ok(
        client.post(
            "/v1/classify", json={"model": "kw", "input": ["refund please"], "options": {"return_meta": True}}
        )
    )
    assert classified["results"][0]["label"] == "billing"
    provenance(classified["meta"], model="kw", revision=REVISION)


@pytest.mark.parametrize(("model", "revision", "layer"), [("kw", REVISION, 0), ("embedder", None, None)])
def test_embeddings_in_base64_from_content_parts_carry_their_representation(
    managed: tuple[httpx.Client, Path, Proc], model: str, revision: str | None, layer: int | None
) -> None:
    client, _, _ = managed
    parts = [{"type": "text", "text": "where is my parcel"}, {"type": "text", "text": "refund"}]
    body = {"model": model, "input": parts, "encoding_format": "base64", "options": {"return_meta": True}}
    answered = ok(client.post("/v1/embeddings", json=body))
    plain = ok(
        client.post("/v1/embeddings", json={"model": model, "input": ["where is my parcel", "refund"]})
    )
    meta = answered["meta"]
    provenance(meta, model=model, revision=revision)
    representation = meta["representation"]
    for item, same in zip(answered["data"], plain["data"], strict=True):
        raw = base64.b64decode(item["embedding"])
        assert len(raw) == 4 * representation["dimension"] == 4 * len(same["embedding"])
    assert representation["model_sha256"] == meta["model_sha256"]
    assert isinstance(representation["layer"], int) and isinstance(representation["normalized"], bool)
    if layer is not None:  # the plugin names no layers: the runtime's derivation says 0
        assert representation["layer"] == layer


@pytest.mark.parametrize("model", ["kw", "embedder", "ranker"])
def test_every_rerank_result_has_a_logit(managed: tuple[httpx.Client, Path, Proc], model: str) -> None:
    client, _, _ = managed
    documents = ["a parcel is late", "refund my invoice", "hello there"]
    body = {"model": model, "query": "refund", "documents": documents, "options": {"return_meta": True}}
    answered = ok(client.post("/v1/rerank", json=body))
    results = answered["results"]
    assert sorted(r["index"] for r in results) == [0, 1, 2]
    for result in results:
        assert isinstance(result["logit"], float) and isinstance(result["relevance_score"], float), result
        assert result["input"]["tokens"] >= 1 and "error" not in result
    # Ordered by relevance, and the logits order them the same way.
    logits = [r["logit"] for r in results]
    assert logits == sorted(logits, reverse=True)
    if model != "ranker":  # a cosine is both the score and the logit; a cross-encoder has its own
        assert all(r["logit"] == r["relevance_score"] for r in results)
    provenance(answered["meta"], model=model, revision=REVISION if model == "kw" else None)


def test_a_bundle_answers_every_surface_over_the_socket(managed: tuple[httpx.Client, Path, Proc]) -> None:
    client, _, _ = managed
    tasks = [
        {"id": "c", "classify": {"model": "kw", "input": "refund please"}},
        {"id": "e", "embeddings": {"model": "embedder", "input": [{"type": "text", "text": "parcel"}]}},
        {"id": "r", "rerank": {"model": "kw", "query": "refund", "documents": ["a parcel", "refund please"]}},
        {"id": "d", "decisions": {"model": "judge", "state": "Where is my parcel?", "questions": QUESTIONS}},
    ]
    results = ok(client.post("/v1/bundle", json={"tasks": tasks}))["results"]
    assert [(r["id"], r["status"]) for r in results] == [("c", 200), ("e", 200), ("r", 200), ("d", 200)]
    assert all("logit" in r for r in results[2]["rerank"]["results"])
    assert results[3]["decisions"]["answers"]["urgent"]["type"] == "noul"


def test_check_config_attaches_over_the_socket(
    managed: tuple[httpx.Client, Path, Proc], tmp_path: Path
) -> None:
    _, socket, _ = managed
    router = tmp_path / "router.yaml"
    router.write_text(
        "global:\n  model_catalog:\n    deployments:\n"
        f"      - {{name: kw, provider: model_runtime, endpoint: 'unix://{socket}', device: cpu}}\n"
        f"      - {{name: gone, provider: model_runtime, endpoint: 'unix://{socket}.missing'}}\n"
    )
    proc = run_cli("check-config", str(router), timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert f"ok   kw @ unix://{socket}: 'kw' is ready on cpu" in lines
    assert any(line.startswith(f"FAIL gone @ unix://{socket}.missing: cannot read") for line in lines)


def test_uds_beside_a_port_and_a_taken_socket_refused(tmp_path: Path) -> None:
    package = write_keywords(tmp_path / "kw")
    socket = tmp_path / "s.sock"
    args = [sys.executable, "-m", "vllm_srun.cli", "serve", str(package), "--uds", str(socket)]
    proc = Proc([*args, "--port", "0", "--uds-mode", "660"], tmp_path / "both.log")
    try:
        port = proc.listening_port()
        with httpx.Client(**http_options(f"unix://{socket}", timeout_s=10.0)) as over_socket:
            wait_healthy(proc, over_socket)
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10.0).status_code == 200
        assert stat.S_IMODE(socket.stat().st_mode) == 0o660
        second = subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=REPO, check=False)
        assert second.returncode == 2
        assert second.stderr.strip().splitlines()[-1] == (
            f"error: --uds {str(socket)!r}: another process is listening there"
        )
    finally:
        proc.stop()
    assert not socket.exists()  # removed on a clean stop
