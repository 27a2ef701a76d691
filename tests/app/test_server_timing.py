"""Server-Timing carries upstream's phases (parse, tokenize, queue, forward, post, serialize,
total), in that order, on every upstream route: on successes and on errors alike."""

from __future__ import annotations

import textwrap
from collections.abc import Callable

import pytest
from helpers import Server, write_keywords

PHASES = ["parse", "tokenize", "queue", "forward", "post", "serialize", "total"]
QUESTIONS = {"urgent": {"type": "noul", "instructions": "Is this urgent?"}}


@pytest.fixture(scope="module")
def server(module_server: Callable[..., Server], tmp_path_factory: pytest.TempPathFactory) -> Server:
    from vllm_srun.testing.nli_fixtures import write_fixture

    root = tmp_path_factory.mktemp("timing")
    models = root / "models.yaml"
    models.write_text(
        textwrap.dedent(f"""\
        models:
          - model: {write_keywords(root / "kw")}
            name: kw
            engine: example_counts
            device: example_host
          - model: {write_fixture(root / "nli", variant="bert")}
            name: judge
            device: cpu
        """)
    )
    return module_server("--models", str(models))


def phases(header: str) -> dict[str, float]:
    """The header's phases in its order; each `name;dur=milliseconds`."""
    parsed = {}
    for part in header.split(", "):
        name, _, duration = part.partition(";dur=")
        parsed[name] = float(duration)
    return parsed


SUCCESSES = [
    ("/v1/classify", {"model": "kw", "input": "refund timing"}),
    ("/v1/embeddings", {"model": "kw", "input": "parcel timing"}),
    ("/v1/rerank", {"model": "kw", "query": "refund", "documents": ["refund timing"]}),
    ("/v1/decisions", {"model": "judge", "state": "Where is my parcel?", "questions": QUESTIONS}),
    ("/v1/systemone", {"model": "judge", "state": "Where is my parcel now?", "questions": QUESTIONS}),
    ("/v1/bundle", {"tasks": [{"id": "a", "classify": {"model": "kw", "input": "invoice timing"}}]}),
]


@pytest.mark.parametrize(("path", "body"), SUCCESSES, ids=[p for p, _ in SUCCESSES])
def test_every_phase_on_a_success(server: Server, path: str, body: dict) -> None:
    response = server.post(path, body)
    assert response.status_code == 200, response.text
    timing = phases(response.headers["server-timing"])
    assert list(timing) == PHASES
    assert all(value >= 0 for value in timing.values())
    # A first request for new text runs a forward; the phases fit in the total.
    assert timing["forward"] > 0 and timing["tokenize"] > 0 and timing["parse"] > 0 and timing["serialize"] > 0
    assert timing["total"] >= max(v for k, v in timing.items() if k != "total")
    if path != "/v1/bundle":  # a single request's phases follow one another
        assert sum(v for k, v in timing.items() if k != "total") <= timing["total"] + 0.01


ERRORS = [
    ("/v1/classify", {"model": "kw", "nope": 1}, 400),
    ("/v1/classify", {"model": "absent", "input": "x"}, 404),
    ("/v1/decisions", {"model": "kw", "state": "x", "questions": QUESTIONS}, 422),
    ("/v1/embeddings", {"input": "x"}, 400),  # two models: `model` is required
    ("/v1/rerank", "not json", 400),
    ("/v1/bundle", {"tasks": [{"id": "a"}]}, 400),
]


@pytest.mark.parametrize(("path", "body", "status"), ERRORS)
def test_every_phase_on_an_error(server: Server, path: str, body: object, status: int) -> None:
    response = server.post(path, body)
    assert response.status_code == status, response.text
    timing = phases(response.headers["server-timing"])
    assert list(timing) == PHASES
    assert timing["forward"] == 0 and timing["total"] > 0


def test_a_refused_model_is_timed_up_to_where_it_stopped(server: Server) -> None:
    # The 422 comes after the body was decoded and the model found: parse is measured, no forward ran.
    response = server.post("/v1/decisions", {"model": "kw", "state": "x", "questions": QUESTIONS})
    timing = phases(response.headers["server-timing"])
    assert 0 < timing["parse"] <= timing["total"] and timing["queue"] == timing["forward"] == 0


def test_other_routes_carry_the_header_too(server: Server) -> None:
    for path in ("/v1/models", "/health", "/health/live", "/metrics"):
        assert list(phases(server.get(path).headers["server-timing"])) == PHASES
