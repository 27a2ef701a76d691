"""Several models per process, built-in models by name, golden readiness, router configs."""

from __future__ import annotations

import json
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import REPO, Server, cache_package, fake_distribution, run_cli, write_keywords

from vllm_srun.plugins.package import combined_sha256, sha256_file

PINNED = "3f1c2a9e8b7d6c5f4e3d2c1b0a9f8e7d6c5b4a39"  # the example table's revision
QUESTIONS = {
    "topic": {
        "type": "choice",
        "instructions": "What is this about?",
        "criteria": {"billing": "money and invoices", "shipping": "parcels and delivery"},
    },
    "urgent": {"type": "noul", "instructions": "Is this urgent?"},
    "level": {"type": "score", "instructions": "How complex is it?", "levels": ["simple", "medium", "hard"]},
}


@pytest.fixture
def nli(tmp_path: Path) -> Path:
    from vllm_srun.testing.nli_fixtures import write_fixture

    return write_fixture(tmp_path / "nli", variant="bert")


def wait_states(server: Server, expected: dict[str, str], timeout_s: float = 60) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        body = server.get("/health").json()
        if {name: model["status"] for name, model in body["models"].items()} == expected:
            return body
        assert time.monotonic() < deadline, body
        time.sleep(0.1)


def test_keyword_and_decision_models_in_one_process(
    start_server: Callable[..., Server], tmp_path: Path, nli: Path
) -> None:
    keywords = write_keywords(tmp_path / "kw")
    models_file = tmp_path / "models.yaml"
    models_file.write_text(
        textwrap.dedent(f"""\
        models:
          - model: {keywords}
            name: kw
            engine: example_counts
            device: example_host
            batching: {{max_num_seqs: 1}}
          - model: {nli}
            name: judge
            device: cpu
        """)
    )
    server = start_server("--models", str(models_file))
    models = {m["id"]: m for m in server.get("/v1/models").json()["data"]}
    assert models["kw"]["device"] == "example_host" and models["judge"]["device"] == "cpu"
    assert models["kw"]["state"] == models["judge"]["state"] == "ready"
    assert (
        models["judge"]["surfaces"] == ["decisions"] and models["judge"]["golden"]["status"] == "unverified"
    )
    assert models["judge"]["modalities"] == ["text"] and "choice" in models["judge"]["question_types"]
    assert models["judge"]["limits"]["min_options"] == 2 and models["judge"]["status"] == "ready"
    assert (
        server.post("/v1/classify", {"model": "kw", "input": "refund"}).json()["results"][0]["label"]
        == "billing"
    )
    assert server.post("/v1/embeddings", {"model": "kw", "input": "parcel"}).status_code == 200
    assert server.post("/v1/rerank", {"model": "kw", "query": "a", "documents": ["b"]}).status_code == 200
    request = {
        "model": "judge",
        "state": {"request": "Where is my parcel?", "context": "support chat"},
        "questions": QUESTIONS,
        "options": {"return_meta": True},
    }
    answers = server.post("/v1/decisions", request).json()
    topic = answers["answers"]["topic"]
    assert topic["choice"] in ("billing", "shipping") and abs(sum(topic["probabilities"].values()) - 1) < 1e-6
    assert 0 <= answers["answers"]["urgent"]["noul"] <= 1
    assert 0 <= answers["answers"]["level"]["score"] <= 2  # levels are 0..n-1, as upstream's
    assert answers["meta"]["cache"]["misses"] > 0
    again = server.post("/v1/systemone", request).json()
    assert again["meta"]["cache"]["misses"] == 0 and again["answers"] == answers["answers"]
    assert (
        server.post("/v1/decisions", {**request, "model": "kw"}).json()["error"]["code"]
        == "unsupported_surface"
    )


def test_a_bad_question_fails_alone(start_server: Callable[..., Server], nli: Path) -> None:
    server = start_server(str(nli))
    questions = {**QUESTIONS, "bad": {"type": "score", "instructions": "x", "levels": ["only one"]}}
    body = server.post("/v1/decisions", {"state": "hello", "questions": questions}).json()
    assert body["answers"]["bad"]["error"] == "invalid_question"
    assert "levels" in body["answers"]["bad"]["message"]
    assert "choice" in body["answers"]["topic"]
    only_bad = server.post("/v1/decisions", {"state": "hello", "questions": {"bad": questions["bad"]}})
    assert only_bad.status_code == 400
    # A job line with no question at all is refused up front, naming the line and the field.
    job = server.post("/v1/jobs", {"surface": "decisions", "requests": [{"state": "hello", "questions": {}}]})
    assert job.status_code == 400, job.text
    assert job.json()["error"]["message"] == "requests item 0: questions: must not be empty"


@pytest.fixture
def hub(tmp_path: Path) -> Path:
    root = tmp_path / "hub"
    root.mkdir()
    return root


def test_builtin_by_name_is_verified(start_server: Callable[..., Server], tmp_path: Path, hub: Path) -> None:
    cache_package(hub, "vllm-sr-example/keywords", PINNED, write_keywords(tmp_path / "src"))
    server = start_server("example-keywords", env={"HF_HUB_CACHE": str(hub)})
    model = server.get("/v1/models").json()["data"][0]
    assert model["id"] == "example-keywords" and model["golden"]["status"] == "matched"
    assert model["golden"]["checked"] == model["golden"]["matched"] >= 1
    assert "matched on cpu" in model["golden"]["reference"]
    assert model["state"] == model["status"] == "ready" and model["ready"] is True
    assert (model["repo"], model["revision"]) == ("vllm-sr-example/keywords", PINNED)
    listing = run_cli("models")
    assert "example-keywords" in listing.stdout and "vllm-sr-example/keywords@3f1c2a9e8b7d" in listing.stdout


def test_a_tampered_builtin_fails_while_another_serves(
    start_server: Callable[..., Server], tmp_path: Path, hub: Path
) -> None:
    source = write_keywords(tmp_path / "src")
    text = (source / "example_model.json").read_text().replace('"invoice"', '"invoices"')
    (source / "example_model.json").write_text(text)
    cache_package(hub, "vllm-sr-example/keywords", PINNED, source)
    plain = write_keywords(tmp_path / "plain")
    server = start_server("example-keywords", str(plain), env={"HF_HUB_CACHE": str(hub)}, ready=False)
    server.wait_ready(path="/health/live")
    health = wait_states(server, {"example-keywords": "failed", "plain": "ready"})
    assert "example_model.json" in health["reasons"]["example-keywords"]
    assert (
        health["status"] == "degraded"
        and "example_model.json" in health["models"]["example-keywords"]["reason"]
    )
    assert server.get("/health").status_code == 503
    assert server.post("/v1/classify", {"model": "plain", "input": "refund"}).status_code == 200
    refused = server.post("/v1/classify", {"model": "example-keywords", "input": "refund"})
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "not_ready"


BAD_TABLE = """
from vllm_sr_example.family import KeywordFamily
from vllm_srun.registry.tables import BuiltinModel, GoldenRecord

class BadFamily(KeywordFamily):
    builtin_table = "acme_bad"
    specificity = -1  # plain keyword packages stay example_keywords'

MODELS = [BuiltinModel(
    name="bad-keywords", repository="acme/bad-keywords", revision="{rev}", family="bad_keywords",
    model_sha256="{identity}", files={{"example_model.json": "{digest}"}}, licence="MIT",
    golden={{"cpu": [GoldenRecord(surface="classify", request={{"input": "refund"}},
                                  expected={{"results": [{{"label": "shipping"}}]}})]}},
)]
"""


def test_a_model_failing_its_golden_check_while_another_serves(
    start_server: Callable[..., Server], tmp_path: Path, hub: Path
) -> None:
    source = write_keywords(tmp_path / "src")
    digest = sha256_file(source / "example_model.json")
    identity = combined_sha256({"example_model.json": digest})
    cache_package(hub, "acme/bad-keywords", PINNED, source)
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    code = BAD_TABLE.format(rev=PINNED, identity=identity, digest=digest)
    fake_distribution(
        plugins, "acme-bad", {"vllm_srun.families": {"bad_keywords": "acme_bad:BadFamily"}}, code
    )
    env = {"HF_HUB_CACHE": str(hub), "PYTHONPATH": f"{plugins}:{REPO}"}
    server = start_server("bad-keywords", str(write_keywords(tmp_path / "plain")), env=env, ready=False)
    server.wait_ready(path="/health/live")
    health = wait_states(server, {"bad-keywords": "failed", "plain": "ready"})
    assert "golden check failed" in health["reasons"]["bad-keywords"]
    model = {m["id"]: m for m in server.get("/v1/models").json()["data"]}["bad-keywords"]
    assert model["golden"]["status"] == "failed" and "golden record 0" in model["golden"]["reference"]
    assert server.post("/v1/classify", {"model": "plain", "input": "refund"}).status_code == 200


def test_conflicting_tables_refuse_every_model(tmp_path: Path) -> None:
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    digest = sha256_file(write_keywords(tmp_path / "src") / "example_model.json")
    identity = combined_sha256({"example_model.json": digest})
    code = BAD_TABLE.format(rev=PINNED, identity=identity, digest=digest).replace(
        "acme/bad-keywords", "vllm-sr-example/keywords"
    )
    fake_distribution(
        plugins, "acme-bad", {"vllm_srun.families": {"bad_keywords": "acme_bad:BadFamily"}}, code
    )
    result = run_cli(
        "serve",
        str(write_keywords(tmp_path / "kw")),
        "--port",
        "0",
        timeout=60,
        env={"PYTHONPATH": f"{plugins}:{REPO}"},
    )
    assert result.returncode != 0
    assert "vllm-sr-example/keywords" in result.stderr
    assert "vllm_sr_example.table" in result.stderr and "acme_bad" in result.stderr


def test_router_config_serves_and_checks(start_server: Callable[..., Server], tmp_path: Path) -> None:
    keywords = write_keywords(tmp_path / "kw")
    router = tmp_path / "router.yaml"
    router.write_text(
        textwrap.dedent(f"""\
        routing: {{strategy: first}}
        global:
          model_catalog:
            deployments:
              - name: intent
                provider: model_runtime
                artifact: {keywords}
                device: cpu
                batching: {{max_num_seqs: 8}}
              - name: elsewhere
                provider: openai
                endpoint: http://127.0.0.1:9/never-called
        """)
    )
    server = start_server("--config", str(router))
    assert (
        server.post("/v1/classify", {"model": "intent", "input": "parcel"}).json()["results"][0]["label"]
        == "shipping"
    )
    checked = tmp_path / "check.yaml"
    checked.write_text(
        textwrap.dedent(f"""\
        global:
          model_catalog:
            deployments:
              - {{name: intent, provider: model_runtime, endpoint: "{server.url}", device: cpu}}
              - {{name: on-gpu, model: intent, provider: model_runtime, endpoint: "{server.url}", device: cuda}}
              - {{name: missing, provider: model_runtime, endpoint: "{server.url}", device: cpu}}
        """)
    )
    result = run_cli("check-config", str(checked), timeout=60)
    lines = result.stdout.splitlines()
    assert result.returncode == 1
    assert lines[0].startswith("ok   intent")
    assert lines[1].startswith("FAIL on-gpu") and "runs on cpu, not cuda" in lines[1]
    assert lines[2].startswith("FAIL missing") and "it serves: intent on cpu" in lines[2]


def test_models_file_rejects_unknown_keys(tmp_path: Path) -> None:
    models_file = tmp_path / "models.yaml"
    models_file.write_text(json.dumps({"models": [{"model": "x", "devcie": "cpu"}]}))
    result = run_cli("serve", "--models", str(models_file), timeout=60)
    assert result.returncode == 2 and "devcie" in result.stderr


def _panicking_tokenizer(out: Path, pattern: str) -> Path:
    """A bert-sequence package whose tokenizer's pre-tokenizer regex gives up (a Rust panic,
    raised in Python as a BaseException) on some texts."""
    from vllm_srun.testing.task_heads_fixtures import write_fixture

    write_fixture(out, variant="bert-sequence")
    tokenizer = json.loads((out / "tokenizer.json").read_text())
    tokenizer["pre_tokenizer"] = {
        "type": "Split",
        "pattern": {"Regex": pattern},
        "behavior": "Isolated",
        "invert": False,
    }
    (out / "tokenizer.json").write_text(json.dumps(tokenizer))
    return out


def test_a_panicking_tokenizer_fails_its_model_or_its_request_alone(
    start_server: Callable[..., Server], tmp_path: Path
) -> None:
    # Panics on the warm-up texts: that model fails; the others are served.
    warm = _panicking_tokenizer(tmp_path / "warm", r"((.)|(.))+\d{5}")
    # Panics only on long runs of "a": serves, and that one request fails.
    runs = _panicking_tokenizer(tmp_path / "runs", r"(a|a)+$")
    server = start_server(str(write_keywords(tmp_path / "kw")), str(warm), str(runs), ready=False)
    server.wait_ready(path="/health/live")
    body = wait_states(server, {"kw": "ready", "warm": "failed", "runs": "ready"})
    assert server.post("/v1/classify", {"model": "kw", "input": "refund"}).status_code == 200
    reason = server.get("/v1/models").json()["data"]
    assert "PanicException" in next(m for m in reason if m["id"] == "warm")["reason"], body
    bad = server.post("/v1/classify", {"model": "runs", "input": ["fine text", "a" * 30 + "b"]})
    assert bad.status_code == 400 and bad.json()["error"]["message"].startswith(
        "input: the model's tokenizer"
    )
    assert server.post("/v1/classify", {"model": "runs", "input": "fine text"}).status_code == 200


def test_a_package_that_breaks_detection_fails_alone(
    start_server: Callable[..., Server], tmp_path: Path
) -> None:
    from vllm_srun.testing.task_heads_fixtures import write_fixture

    broken = write_fixture(tmp_path / "broken", variant="bert-embedding")
    (broken / "1_Pooling" / "config.json").write_text("[]")  # a list where a mapping belongs
    server = start_server(str(write_keywords(tmp_path / "kw")), str(broken), ready=False)
    server.wait_ready(path="/health/live")
    wait_states(server, {"kw": "ready", "broken": "failed"})
    reason = next(m for m in server.get("/v1/models").json()["data"] if m["id"] == "broken")["reason"]
    # The sentence-transformers reader names the file (it once failed as a bare AttributeError).
    assert "1_Pooling/config.json" in reason and "broken" in reason, reason
