"""Callers apart (issue 22 part 4): with several API keys, another key cannot read, cancel or
reuse a caller's job, nor learn from a cache hit what the caller sent; the docs pages and the
document answer anyone, and the document's bearer scheme marks exactly the guarded operations.
Real HTTP on 127.0.0.1, one server per mode, every test bounded in seconds."""

from __future__ import annotations

import random
import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import msgspec
import openai
import pytest
from app.test_docs_offline import CHROMIUM, render
from helpers import Server, write_keywords

from vllm_srun.app.tenants import Callers, read_key_file
from vllm_srun.errors import ConfigError
from vllm_srun.queue import keys

ALICE, BOB = "alice-" + "a" * 32, "bob-" + "b" * 32


def _key_file(root: Path) -> Path:
    path = root / "keys"
    path.write_text(f"# callers\n{ALICE}\n\n{BOB}\n")
    return path


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_keywords(tmp_path_factory.mktemp("tenants") / "kw")


@pytest.fixture(scope="module")
def server(
    module_server: Callable[..., Server], package: Path, tmp_path_factory: pytest.TempPathFactory
) -> Server:
    keyfile = _key_file(tmp_path_factory.mktemp("keys"))
    return module_server(str(package), "--served-model-name", "kw", "--api-key-file", str(keyfile))


@pytest.fixture(scope="module")
def shared(
    module_server: Callable[..., Server], package: Path, tmp_path_factory: pytest.TempPathFactory
) -> Server:
    keyfile = _key_file(tmp_path_factory.mktemp("keys-shared"))
    return module_server(
        str(package), "--served-model-name", "kw", "--api-key-file", str(keyfile), "--shared-cache"
    )


def call(server: Server, method: str, path: str, key: str, **kwargs: object) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}", **kwargs.pop("headers", {})}  # type: ignore[dict-item]
    return httpx.request(method, server.url + path, headers=headers, timeout=30, **kwargs)  # type: ignore[arg-type]


def create_job(server: Server, key: str, texts: list[str], **headers: str) -> httpx.Response:
    body = {"surface": "embeddings", "requests": [{"input": t} for t in texts]}
    return call(server, "POST", "/v1/jobs", key, json=body, headers=headers)


def wait_done(server: Server, key: str, job_id: str) -> dict:
    deadline = time.monotonic() + 20
    while True:
        status = call(server, "GET", f"/v1/jobs/{job_id}", key).json()
        if status["status"] in ("completed", "failed", "cancelled"):
            return status
        assert time.monotonic() < deadline, status
        time.sleep(0.05)


def embed(server: Server, key: str, text: str) -> tuple[dict, dict[str, float]]:
    r = call(server, "POST", "/v1/embeddings", key, json={"input": text, "options": {"return_meta": True}})
    assert r.status_code == 200, r.text
    timing = {}
    for part in r.headers["server-timing"].split(","):
        name, _, dur = part.strip().partition(";dur=")
        timing[name] = float(dur)
    return r.json()["meta"]["cache"], timing


WORDS = ("refund", "invoice", "charge", "parcel", "delivery")  # the keyword model's vocabulary


def fresh(prefix: str) -> str:
    """A text no test sent before: the keyword model's ids are its known words (others are 0),
    so a random run of 16 of them (5**16 choices)."""
    rng = random.Random(f"{prefix}-{uuid.uuid4().hex}")
    return " ".join(rng.choice(WORDS) for _ in range(16))


def test_every_key_in_the_file_is_a_caller_and_others_are_refused(server: Server) -> None:
    for key in (ALICE, BOB):
        assert call(server, "GET", "/v1/models", key).status_code == 200
    for key in ("nobody", ALICE[:-1], ALICE + BOB):
        assert call(server, "GET", "/v1/models", key).status_code == 401, key
    assert httpx.get(server.url + "/v1/jobs/job_" + "0" * 32, timeout=5).status_code == 401


def test_another_key_gets_404_for_the_job_its_results_events_and_cancel(server: Server) -> None:
    created = create_job(server, ALICE, ["refund", "parcel"])
    assert created.status_code == 202, created.text
    job = created.json()["id"]
    missing = "job_" + "0" * 32
    for path in (f"/v1/jobs/{job}", f"/v1/jobs/{job}/results", f"/v1/jobs/{job}/events"):
        theirs = call(server, "GET", path, BOB)
        nobodys = call(server, "GET", path.replace(job, missing), BOB)
        assert theirs.status_code == 404 == nobodys.status_code, (path, theirs.text)
        # It reads exactly as a job that does not exist: nothing says the id is taken.
        assert theirs.json()["error"]["code"] == nobodys.json()["error"]["code"] == "job_not_found"
        assert theirs.text.replace(job, missing) == nobodys.text
    assert call(server, "POST", f"/v1/jobs/{job}/cancel", BOB).status_code == 404
    status = wait_done(server, ALICE, job)
    assert status["status"] == "completed"  # Bob's cancel did nothing
    results = call(server, "GET", f"/v1/jobs/{job}/results", ALICE).json()
    assert len(results["data"]) == 2
    with httpx.stream(
        "GET", f"{server.url}/v1/jobs/{job}/events", headers={"authorization": f"Bearer {ALICE}"}, timeout=10
    ) as events:
        assert events.status_code == 200
        assert "event: status" in "".join(events.iter_text())


def test_an_idempotency_key_is_the_callers_own(server: Server) -> None:
    key, other_key = f"same-{uuid.uuid4().hex}", f"same-{uuid.uuid4().hex}"
    alice = create_job(server, ALICE, ["refund"], **{"idempotency-key": key})
    assert alice.status_code == 202
    # Bob sends Alice's key string with Alice's very body: his own new job, never hers.
    bob = create_job(server, BOB, ["refund"], **{"idempotency-key": key})
    assert bob.status_code == 202, bob.text
    assert bob.json()["id"] != alice.json()["id"]
    # With another body: his own job too, not a 422 that would tell him the key is in use.
    create_job(server, ALICE, ["refund"], **{"idempotency-key": other_key})
    assert create_job(server, BOB, ["parcel"], **{"idempotency-key": other_key}).status_code == 202
    # Each caller's retry finds their own job; another body is still 422 for the key's owner.
    for caller, made in ((ALICE, alice), (BOB, bob)):
        again = create_job(server, caller, ["refund"], **{"idempotency-key": key})
        assert again.status_code == 200 and again.json()["id"] == made.json()["id"]
    assert create_job(server, ALICE, ["other"], **{"idempotency-key": key}).status_code == 422


def test_cache_hits_are_not_visible_across_keys(server: Server) -> None:
    text = fresh("secret")
    first, _ = embed(server, ALICE, text)
    assert first == {"hits": 0, "misses": 1}
    mine, _ = embed(server, ALICE, text)
    assert mine == {"hits": 1, "misses": 0}  # a caller's own cache still answers
    # Bob sends the same text: nothing in his answer says Alice sent it.
    theirs, timing = embed(server, BOB, text)
    assert theirs == {"hits": 0, "misses": 1}
    assert timing["forward"] > 0


def test_a_job_learns_nothing_of_another_callers_inputs(server: Server) -> None:
    text = fresh("private")
    embed(server, ALICE, text)  # in Alice's cache now
    created = create_job(server, BOB, [text])
    status = wait_done(server, BOB, created.json()["id"])
    assert status["counts"]["cached"] == 0
    # And what Bob's job computed is no hit for Alice's interactive request of another text
    # he sent in it first.
    other = fresh("bobs")
    wait_done(server, BOB, create_job(server, BOB, [other]).json()["id"])
    assert embed(server, ALICE, other)[0] == {"hits": 0, "misses": 1}
    assert embed(server, BOB, other)[0] == {"hits": 1, "misses": 0}


def test_shared_cache_shares_hits_and_says_so(shared: Server) -> None:
    """--shared-cache is the operator's choice to share: a hit then tells one caller that some
    caller sent that exact input (docs/getting-started.md, "Several API keys")."""
    text = fresh("shared")
    assert embed(shared, ALICE, text)[0] == {"hits": 0, "misses": 1}
    hits, timing = embed(shared, BOB, text)
    assert hits == {"hits": 1, "misses": 0} and timing["forward"] == 0.0
    # Jobs stay their caller's, shared cache or not.
    job = create_job(shared, ALICE, ["refund"]).json()["id"]
    assert call(shared, "GET", f"/v1/jobs/{job}", BOB).status_code == 404


def test_callers_hold_digests_and_salt_only_several_keys(tmp_path: Path) -> None:
    one = Callers([ALICE])
    assert one.identify(ALICE) == one.identify(ALICE) and one.identify(ALICE).cache_salt == ""  # type: ignore[union-attr]
    several = Callers([ALICE, BOB])
    a, b = several.identify(ALICE), several.identify(BOB)
    assert a is not None and b is not None and a.id != b.id
    assert a.cache_salt == keys.cache_salt(ALICE) and a.cache_salt != b.cache_salt
    assert Callers([ALICE, BOB], shared_cache=True).identify(BOB).cache_salt == ""  # type: ignore[union-attr]
    assert several.identify("") is None and several.identify("x") is None
    assert ALICE not in repr(vars(several))
    (tmp_path / "empty").write_text("# nothing\n\n")
    with pytest.raises(ConfigError, match="no key"):
        read_key_file(tmp_path / "empty")
    (tmp_path / "spaced").write_text("a key\n")
    with pytest.raises(ConfigError, match="spaces"):
        read_key_file(tmp_path / "spaced")


def test_health_without_a_key_says_only_the_status(server: Server) -> None:
    """L2: with keys configured, /health answers anyone (probes carry no key) but shows model
    names and reasons only to a caller with a valid key."""
    bare = httpx.get(server.url + "/health", timeout=30)
    assert bare.status_code == 200
    body = bare.json()
    assert body["status"] == "ready" and body["models"] == {}
    assert body["reason"] is None and body["model"] is None  # present, as the router's probe reads them
    assert "kw" not in bare.text
    wrong = httpx.get(server.url + "/health", headers={"authorization": "Bearer nope"}, timeout=30)
    assert wrong.json()["models"] == {}
    keyed = call(server, "GET", "/health", ALICE)
    assert keyed.json()["model"] == "kw" and "kw" in keyed.json()["models"]


def test_docs_and_the_document_answer_without_a_key_and_nothing_else_does(server: Server) -> None:
    """With keys, the pages, what they load and the document answer anyone (a browser sends no
    key; they hold no caller's data); every operation the document marks `bearer` refuses a
    request without a key, every other answers it: the document and the guard agree."""
    for path in ("/docs", "/docs/redoc", "/docs/swagger", "/openapi.json", "/openapi.yaml"):
        assert httpx.get(server.url + path, timeout=30).status_code == 200, path
    sources = re.findall(r'(?:src|href)="(/docs/static/[^"]+)"', httpx.get(server.url + "/docs/swagger").text)
    assert sources and all(httpx.get(server.url + s, timeout=30).status_code == 200 for s in sources)
    document = httpx.get(server.url + "/openapi.json", timeout=30).json()
    assert document["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": document["components"]["securitySchemes"]["bearer"]["description"],
    }
    refused, answered = set(), set()
    for path, item in document["paths"].items():
        for method, operation in item.items():
            url = server.url + re.sub(r"\{[^}]+\}", "x", path)
            status = httpx.request(method, url, json={}, timeout=30).status_code
            (refused if status == 401 else answered).add((method, path))
            assert (status == 401) == (operation.get("security") == [{"bearer": []}]), (method, path, status)
    assert ("get", "/health") in answered and ("get", "/") in answered and ("post", "/") in refused
    assert len(refused) > 40
    body = {"model": "kw", "input": "refund"}
    assert httpx.post(server.url + "/v1/embeddings", json=body, timeout=30).status_code == 401
    assert call(server, "POST", "/v1/embeddings", ALICE, json=body).status_code == 200


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium)")
def test_swagger_ui_offers_authorize_with_keys(server: Server, tmp_path: Path) -> None:
    """A browser, with no key, renders Swagger UI with its Authorize button (the document's
    bearer scheme) and a lock on a guarded operation."""
    dom = render(server.url + "/docs/swagger", tmp_path / "swagger")
    assert 'class="btn authorize' in dom
    assert 'id="operations-Surfaces-V1ClassifyClassify"' in dom


def test_another_key_gets_404_for_batch_files_and_batches(server: Server) -> None:
    alice = openai.OpenAI(base_url=f"{server.url}/v1", api_key=ALICE)
    bob = openai.OpenAI(base_url=f"{server.url}/v1", api_key=BOB)
    line = {"custom_id": "a", "method": "POST", "url": "/v1/classify", "body": {"input": ["refund"]}}
    upload = alice.files.create(file=("in.jsonl", msgspec.json.encode(line)), purpose="batch")
    batch = alice.batches.create(input_file_id=upload.id, endpoint="/v1/classify", completion_window="24h")
    for attempt in (
        lambda: bob.files.retrieve(upload.id),
        lambda: bob.files.content(upload.id),
        lambda: bob.batches.retrieve(batch.id),
        lambda: bob.batches.cancel(batch.id),
        lambda: bob.batches.create(input_file_id=upload.id, endpoint="/v1/classify", completion_window="24h"),
    ):
        with pytest.raises(openai.NotFoundError):
            attempt()
    assert upload.id not in [f.id for f in bob.files.list()]
    assert batch.id not in [b.id for b in bob.batches.list()]
    assert alice.batches.retrieve(batch.id).id == batch.id
