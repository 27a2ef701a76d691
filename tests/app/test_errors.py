"""Each error code from a real malformed (or unlucky) request, over real HTTP."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from helpers import RedisProcess, Server, write_keywords

import vllm_srun


@pytest.fixture(scope="module")
def server(module_server: Callable[..., Server], tmp_path_factory: pytest.TempPathFactory) -> Server:
    root = tmp_path_factory.mktemp("pkgs")
    packages = [
        write_keywords(root / "kw"),
        write_keywords(root / "conly", "classify-only"),
        write_keywords(root / "short", "short"),
    ]
    return module_server(
        *map(str, packages),
        "--max-request-bytes",
        "4000",
        "--max-inputs",
        "8",
        "--max-queued-items",
        "6",
    )


def error_of(response: httpx.Response, status: int) -> dict[str, str]:
    assert response.status_code == status, response.text
    error: dict[str, str] = response.json()["error"]
    assert set(error) == {"code", "message", "type", "param"} and error["message"]
    if status < 500 and status not in (401, 429):
        assert error["type"] == "invalid_request_error"
    return error


def test_error_bodies_carry_openai_type_and_param(server: Server) -> None:
    """OpenAI clients read `type` and `param`: the field at fault, or null."""
    wrong_type = error_of(server.post("/v1/classify", {"model": "kw", "input": 5}), 400)
    assert wrong_type["type"] == "invalid_request_error" and wrong_type["param"] == "input"
    unknown = error_of(server.post("/v1/classify", {"model": "nope", "input": "x"}), 404)
    assert unknown["type"] == "invalid_request_error" and unknown["param"] is None


def test_400_not_json(server: Server) -> None:
    r = httpx.post(
        server.url + "/v1/classify", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert error_of(r, 400)["code"] == "invalid_request"


def test_400_names_the_field(server: Server) -> None:
    wrong_type = error_of(server.post("/v1/classify", {"model": "kw", "input": [1]}), 400)
    assert wrong_type["code"] == "invalid_request" and wrong_type["message"].startswith("input[0]:")
    unknown = error_of(
        server.post("/v1/classify", {"model": "kw", "input": "x", "options": {"colour": 1}}), 400
    )
    assert "colour" in unknown["message"]
    missing = error_of(server.post("/v1/rerank", {"model": "kw", "documents": ["a"]}), 400)
    assert "query" in missing["message"]
    bad_range = error_of(server.post("/v1/embeddings", {"model": "kw", "input": "x", "dimensions": 0}), 400)
    assert "dimensions" in bad_range["message"]


def test_400_names_the_body_and_the_counted_field(server: Server) -> None:
    headers = {"content-type": "application/json"}
    empty = httpx.post(server.url + "/v1/classify", content=b"", headers=headers)
    assert error_of(empty, 400)["message"] == "body: a JSON object is required"
    null = httpx.post(server.url + "/v1/classify", content=b"null", headers=headers)
    assert error_of(null, 400)["message"].startswith("body: Expected `object`")
    documents = server.post("/v1/rerank", {"model": "kw", "query": "q", "documents": ["d"] * 9})
    assert error_of(documents, 413)["message"].startswith("documents: 9 documents; at most 8")
    assert server.post("/v1/rerank", {"model": "kw", "query": "q", "documents": ["d"] * 5}).status_code == 200


def test_400_model_required_when_several_served(server: Server) -> None:
    error = error_of(server.post("/v1/classify", {"input": "refund"}), 400)
    assert error["message"].startswith("model:")


def test_404_model_not_found(server: Server) -> None:
    error = error_of(server.post("/v1/classify", {"model": "nope", "input": "refund"}), 404)
    assert error["code"] == "model_not_found" and "kw" in error["message"]


def test_404_unknown_route_has_the_error_shape(server: Server) -> None:
    assert error_of(server.get("/v1/nothing"), 404)["code"] == "not_found"


def test_413_body_too_large(server: Server) -> None:
    error = error_of(server.post("/v1/classify", {"model": "kw", "input": "x" * 5000}), 413)
    assert error["code"] == "request_too_large"


def test_413_too_many_inputs(server: Server) -> None:
    error = error_of(server.post("/v1/classify", {"model": "kw", "input": ["a"] * 9}), 413)
    assert error["code"] == "request_too_large" and "--max-inputs" in error["message"]


def test_422_unsupported_surface(server: Server) -> None:
    error = error_of(server.post("/v1/embeddings", {"model": "conly", "input": "refund"}), 422)
    assert error["code"] == "unsupported_surface"
    assert server.post("/v1/classify", {"model": "conly", "input": "refund"}).status_code == 200


def test_413_a_request_the_queue_bounds_never_admit(server: Server) -> None:
    # 7 items against --max-queued-items 6: no wait would let it in, so no 429 to retry.
    r = server.post("/v1/classify", {"model": "kw", "input": [f"text {i}" for i in range(7)]})
    error = error_of(r, 413)
    assert error["code"] == "request_too_large" and "--max-queued-items" in error["message"]
    assert "retry-after" not in r.headers
    assert server.post("/v1/classify", {"model": "kw", "input": ["refund"] * 6}).status_code == 200


def test_400_body_not_utf8_or_nested_too_deep(server: Server) -> None:
    headers = {"content-type": "application/json"}
    bad_bytes = httpx.post(
        server.url + "/v1/classify", content=b'{"model":"kw","input":"\xff"}', headers=headers
    )
    assert "UTF-8" in error_of(bad_bytes, 400)["message"]
    deep = b'{"model":"kw","input":' + b"[" * 1500 + b"]" * 1500 + b"}"
    nested = httpx.post(server.url + "/v1/classify", content=deep, headers=headers)
    assert "nested too deeply" in error_of(nested, 400)["message"]
    assert (
        server.post("/v1/classify", {"model": "kw", "input": "refund"}).json()["results"][0]["label"]
        == "billing"
    )


def test_unknown_model_names_add_no_metric_series(server: Server) -> None:
    name = "attacker-" + "m" * 3000
    error = error_of(server.post("/v1/classify", {"model": name, "input": "refund"}), 404)
    assert len(error["message"]) < 400  # the name is cut in the message
    assert "attacker" not in server.get("/metrics").text


def test_item_error_in_place_never_fails_siblings(server: Server) -> None:
    body = {"model": "short", "input": ["one two three four five six seven refund", "refund"]}
    results = server.post("/v1/classify", body).json()["results"]
    assert results[0]["error"] == "max_length_exceeded" and "8 tokens" in results[0]["message"]
    assert results[0]["input"] == {
        "tokens": 8,
        "processed_tokens": 8,
        "truncated": False,
        "tokens_lower_bound": False,
        "windows": 1,
    }
    assert results[1]["label"] == "billing"
    body["options"] = {"overflow": "truncate"}
    truncated = server.post("/v1/classify", body).json()["results"][0]
    assert truncated["input"]["truncated"] is True and truncated["input"]["processed_tokens"] == 5


def test_401_api_key(start_server: Callable[..., Server], keywords: Path) -> None:
    server = start_server(str(keywords), "--api-key", "s3cret")
    assert server.get("/health").status_code == 200
    # GET / is open like /health, and tells the version only to a caller with a key.
    index = server.get("/")
    assert index.status_code == 200 and index.json()["version"] is None
    assert index.json()["links"]["docs"] == "/docs"
    keyed = server.get("/", headers={"authorization": "Bearer s3cret"}).json()
    assert keyed["version"] == vllm_srun.__version__
    assert error_of(server.get("/v1/models"), 401)["code"] == "unauthorized"
    assert error_of(server.post("/v1/classify", {"input": "x"}), 401)["code"] == "unauthorized"
    assert server.get("/v1/models", headers={"authorization": "Bearer s3cret"}).status_code == 200
    assert server.post("/v1/classify", {"input": "x"}, headers={"x-api-key": "s3cret"}).status_code == 200


def test_503_not_ready_without_a_worker(
    start_server: Callable[..., Server], keywords: Path, redis_proc: RedisProcess
) -> None:
    server = start_server(str(keywords), "--redis", redis_proc.url)
    health = server.get("/health")
    assert health.status_code == 503 and health.json()["states"] == {"keywords": "no_worker"}
    assert health.json()["models"]["keywords"]["status"] == "degraded"
    # GET / (TEI's Inference API health route too) has /health's status.
    index = server.get("/")
    assert index.status_code == 503 and index.json()["status"] == "degraded"
    assert error_of(server.post("/v1/classify", {"input": "refund"}), 503)["code"] == "not_ready"


def test_503_unavailable_when_redis_goes(
    start_server: Callable[..., Server], keywords: Path, redis_proc: RedisProcess
) -> None:
    server = start_server(str(keywords), "--redis", redis_proc.url)
    redis_proc.stop()
    started = time.monotonic()
    error = error_of(server.post("/v1/classify", {"input": "refund"}), 503)
    # Upstream's code for a runtime that cannot serve now; the message says why.
    assert error["code"] == "not_ready" and time.monotonic() - started < 5
    assert "redis" in error["message"].lower()


def test_start_refuses_unreachable_redis(tmp_path: Path, keywords: Path) -> None:
    from helpers import Proc, free_port

    proc = Proc(
        ["vllm-srun", "serve", str(keywords), "--redis", f"redis://127.0.0.1:{free_port()}"], tmp_path / "log"
    )
    assert proc.proc.wait(timeout=30) == 2
    assert "cannot reach Redis at redis://127.0.0.1" in proc.log()


def test_param_names_the_field_a_message_starts_with() -> None:
    """OpenAI clients expose `param`: every error whose message names its field first has it,
    not only those raised with an explicit one."""
    from vllm_srun.errors import InvalidRequest, Unavailable

    assert InvalidRequest("options.head: no head 'x'").param == "options.head"
    assert InvalidRequest("input[3]: 600 tokens").param == "input[3]"
    assert InvalidRequest("anything", param="input").param == "input"
    assert Unavailable("Redis is unreachable: refused").param is None
    assert InvalidRequest("model 'x' is not served").param is None


def test_upstream_routes_answer_upstream_error_codes() -> None:
    from vllm_srun.app.errors import UPSTREAM_ERROR_CODES, upstream_code

    assert upstream_code("unavailable", 503) == "not_ready"
    assert upstream_code("job_not_found", 404) == "model_not_found"
    assert upstream_code("not_found", 404) == "model_not_found"
    assert upstream_code("http_error", 500) == "internal_error"
    assert {upstream_code(code, 400) for code in UPSTREAM_ERROR_CODES} == UPSTREAM_ERROR_CODES
    # Statuses upstream does not document are this server's own, with its own codes.
    assert upstream_code("unauthorized", 401) == "unauthorized"
    assert upstream_code("method_not_allowed", 405) == "method_not_allowed"
