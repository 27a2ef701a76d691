"""POST /v1/bundle over real HTTP: several surfaces and models in one call, each task answered
as its own route would answer it, tasks sharing batches, and the bundle's own limits."""

from __future__ import annotations

import textwrap
from collections.abc import Callable

import pytest
from helpers import Server, metric, write_keywords

QUESTIONS = {
    "topic": {
        "type": "choice",
        "instructions": "What is this about?",
        "criteria": {"billing": "money and invoices", "shipping": "parcels and delivery"},
    },
    "urgent": {"type": "noul", "instructions": "Is this urgent?"},
}


@pytest.fixture(scope="module")
def server(module_server: Callable[..., Server], tmp_path_factory: pytest.TempPathFactory) -> Server:
    from vllm_srun.testing.nli_fixtures import write_fixture

    root = tmp_path_factory.mktemp("bundle")
    models = root / "models.yaml"
    models.write_text(
        textwrap.dedent(f"""\
        models:
          - model: {write_keywords(root / "kw", "batching")}
            name: kw
            engine: example_counts
            device: example_host
            batching: {{batch_wait_ms: 300}}
          - model: {write_fixture(root / "nli", variant="bert")}
            name: judge
            device: cpu
        """)
    )
    return module_server("--models", str(models), "--max-request-bytes", "200000", "--max-bundle-tasks", "8")


def alone(server: Server, path: str, body: dict) -> tuple[int, dict]:
    response = server.post(path, body)
    return response.status_code, response.json()


def test_mixed_surfaces_and_models_each_answered_as_alone(server: Server) -> None:
    classify = {"model": "kw", "input": ["refund please", "where is my parcel"]}
    embeddings = {"model": "kw", "input": "parcel"}
    rerank = {"model": "kw", "query": "refund", "documents": ["a parcel", "refund please"]}
    decisions = {"model": "judge", "state": "Where is my parcel?", "questions": QUESTIONS}
    tasks = [
        {"id": "c", "classify": classify},
        {"id": "e", "embeddings": embeddings},
        {"id": "r", "rerank": rerank},
        {"id": "d", "decisions": decisions},
    ]
    response = server.post("/v1/bundle", {"tasks": tasks})
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [r["id"] for r in results] == ["c", "e", "r", "d"]
    assert all(r["status"] == 200 and "error" not in r for r in results)
    expected = {
        "c": alone(server, "/v1/classify", classify),
        "e": alone(server, "/v1/embeddings", embeddings),
        "r": alone(server, "/v1/rerank", rerank),
        "d": alone(server, "/v1/decisions", decisions),
    }
    for result, surface in zip(results, ["classify", "embeddings", "rerank", "decisions"], strict=True):
        status, body = expected[result["id"]]
        assert status == 200
        assert set(result) == {"id", "status", surface}
        assert result[surface] == body, surface


def test_a_failing_task_keeps_its_own_status(server: Server) -> None:
    tasks = [
        {"id": "ok", "classify": {"model": "kw", "input": "refund"}},
        {"id": "unknown", "classify": {"model": "nope", "input": "refund"}},
        {"id": "surface", "decisions": {"model": "kw", "state": "x", "questions": QUESTIONS}},
        {"id": "malformed", "classify": {"model": "kw"}},
        {
            "id": "options",
            "rerank": {"model": "kw", "query": "q", "documents": ["d"], "options": {"colour": 1}},
        },
    ]
    response = server.post("/v1/bundle", {"tasks": tasks})
    assert response.status_code == 200, response.text
    results = {r["id"]: r for r in response.json()["results"]}
    assert results["ok"]["status"] == 200 and results["ok"]["classify"]["results"][0]["label"] == "billing"
    for task_id, status, code in [
        ("unknown", 404, "model_not_found"),
        ("surface", 422, "unsupported_surface"),
        ("malformed", 400, "invalid_request"),
        ("options", 400, "invalid_request"),
    ]:
        result = results[task_id]
        assert (result["status"], result["error"]["code"]) == (status, code), result
        assert set(result) == {"id", "status", "error"}
    # Each as its own route answers it alone.
    unknown = server.post("/v1/classify", tasks[1]["classify"])
    assert (
        unknown.status_code == 404
        and unknown.json()["error"]["message"] == results["unknown"]["error"]["message"]
    )
    malformed = server.post("/v1/classify", tasks[3]["classify"])
    assert malformed.status_code == 400 and malformed.json()["error"] == results["malformed"]["error"]


MALFORMED = [
    {"model": "kw"},
    {"model": "kw", "input": 5},
    {"model": "kw", "input": ["x", 5]},
    {"model": "kw", "input": "x", "colour": 1},
    {"model": "kw", "input": "x", "options": {"threshold": 2}},
    "x",
    ["x"],
    5,
]


@pytest.mark.parametrize("body", MALFORMED, ids=[str(i) for i in range(len(MALFORMED))])
def test_a_body_that_does_not_decode_fails_its_task_alone_as_on_its_route(
    server: Server, body: object
) -> None:
    # The same error, code, message and param, as the surface's own route answers it; a body
    # that is not an object at all is the task's fault too, not the bundle's.
    tasks = [{"id": "bad", "classify": body}, {"id": "ok", "classify": {"model": "kw", "input": "refund"}}]
    response = server.post("/v1/bundle", {"tasks": tasks})
    assert response.status_code == 200, response.text
    bad, fine = response.json()["results"]
    alone = server.post("/v1/classify", body)
    assert alone.status_code == 400, alone.text
    assert bad == {"id": "bad", "status": 400, "error": alone.json()["error"]}
    assert fine["status"] == 200 and fine["classify"]["results"][0]["label"] == "billing"


def test_tasks_for_one_model_share_its_batches(server: Server) -> None:
    before = server.get("/metrics").text
    # Distinct keyword counts: the example model reads only its keywords, and identical items
    # would be computed once.
    texts = ["invoice " * (i + 2) for i in range(6)]
    tasks = [{"id": str(i), "classify": {"model": "kw", "input": t}} for i, t in enumerate(texts)]
    response = server.post("/v1/bundle", {"tasks": tasks})
    assert response.status_code == 200 and all(r["status"] == 200 for r in response.json()["results"])
    after = server.get("/metrics").text
    rows = metric(after, "vllm_srun_batch_size_sum", model="kw") - metric(
        before, "vllm_srun_batch_size_sum", model="kw"
    )
    forwards = metric(after, "vllm_srun_batch_size_count", model="kw") - metric(
        before, "vllm_srun_batch_size_count", model="kw"
    )
    assert rows == 6
    assert forwards < 6, f"{forwards} forwards for 6 tasks of one model"
    counted = metric(after, "vllm_srun_requests_total", model="", surface="bundle", status="200")
    assert counted > metric(before, "vllm_srun_requests_total", model="", surface="bundle", status="200")


def test_the_bundle_deadline_applies_unless_a_task_has_an_earlier_one(server: Server) -> None:
    tasks = [{"id": "a", "classify": {"model": "kw", "input": "refund deadline"}}]
    ok = server.post("/v1/bundle", {"tasks": tasks, "options": {"deadline_ms": 30000}})
    assert ok.status_code == 200 and ok.json()["results"][0]["status"] == 200
    assert "error" not in ok.json()["results"][0]["classify"]["results"][0]
    # The bundle's deadline is the earlier: it passes before the item can run.
    late = {"model": "kw", "input": "refund deadline passed", "options": {"deadline_ms": 60000}}
    passed = server.post(
        "/v1/bundle", {"tasks": [{"id": "a", "classify": late}], "options": {"deadline_ms": 0.001}}
    )
    (result,) = passed.json()["results"]
    assert result["status"] == 200 and result["classify"]["results"][0]["error"] == "deadline_exceeded"
    for options in ({"deadline_ms": 0}, {"deadline_ms": -1}, {"colour": 1}):
        refused = server.post("/v1/bundle", {"tasks": tasks, "options": options})
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_request", (
            refused.text
        )


@pytest.mark.parametrize(
    ("tasks", "field"),
    [
        ([{"id": "a"}], "tasks[0]"),
        ([{"id": "a", "classify": {"input": "x"}, "rerank": {"query": "q", "documents": ["d"]}}], "tasks[0]"),
        ([{"id": "a", "classify": {"input": "x"}}, {"id": "a", "classify": {"input": "y"}}], "tasks[1].id"),
    ],
)
def test_a_task_without_exactly_one_surface_or_with_a_repeated_id_refuses_the_bundle(
    server: Server, tasks: list[dict], field: str
) -> None:
    response = server.post("/v1/bundle", {"tasks": tasks})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request" and error["param"] == field
    assert error["message"].startswith(field)


def test_limits_on_tasks_and_bytes(server: Server) -> None:
    limits = server.get("/v1/models").json()["limits"]
    assert limits == {"max_bundle_tasks": 8, "max_request_bytes": 200000}
    task = {"classify": {"model": "kw", "input": "refund"}}
    most = [{"id": str(i), **task} for i in range(limits["max_bundle_tasks"])]
    assert server.post("/v1/bundle", {"tasks": most}).status_code == 200
    over = server.post("/v1/bundle", {"tasks": [*most, {"id": "one more", **task}]})
    assert over.status_code == 413 and over.json()["error"]["code"] == "request_too_large"
    assert str(limits["max_bundle_tasks"]) in over.json()["error"]["message"]
    big = server.post(
        "/v1/bundle", {"tasks": [{"id": "a", "classify": {"model": "kw", "input": "x" * 250000}}]}
    )
    assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"
    empty = server.post("/v1/bundle", {"tasks": []})
    assert empty.status_code == 400 and empty.json()["error"]["code"] == "invalid_request"


def test_server_timing_of_a_bundle(server: Server) -> None:
    tasks = [
        {"id": "c", "classify": {"model": "kw", "input": "refund timing"}},
        {"id": "d", "decisions": {"model": "judge", "state": "timing", "questions": QUESTIONS}},
    ]
    response = server.post("/v1/bundle", {"tasks": tasks})
    phases = dict(part.split(";dur=") for part in response.headers["server-timing"].split(", "))
    assert list(phases) == ["parse", "tokenize", "queue", "forward", "post", "serialize", "total"]
    values = {k: float(v) for k, v in phases.items()}
    assert values["forward"] > 0 and values["tokenize"] > 0
    assert all(0 <= v <= values["total"] for v in values.values())
