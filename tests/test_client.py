"""vllm_srun.client, sync and async, over real HTTP against a served keyword model."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator

import pytest
from helpers import Server, write_keywords

from vllm_srun.client import APIError, AsyncClient, Client, JobEvent

pytestmark = pytest.mark.timeout(60)

TEXTS = ["Please refund the invoice", "Where is my parcel?", "hello there"]
LABELS = ["billing", "shipping", "other"]


@pytest.fixture(scope="module")
def server(module_server: Callable[..., Server], tmp_path_factory: pytest.TempPathFactory) -> Server:
    package = write_keywords(tmp_path_factory.mktemp("pkg") / "kw")
    return module_server(str(package), "--served-model-name", "kw")


@pytest.fixture
def client(server: Server) -> Iterator[Client]:
    with Client(server.url, timeout_s=30) as c:
        yield c


def job_requests(n: int) -> list[dict[str, object]]:
    return [{"input": TEXTS[i % 3], "custom_id": f"row-{i}"} for i in range(n)]


def check_results(results: list[dict[str, object]], n: int) -> None:
    assert [r["index"] for r in results] == list(range(n))
    assert [r["custom_id"] for r in results] == [f"row-{i}" for i in range(n)]
    labels = [r["response"]["results"][0]["label"] for r in results]  # type: ignore[index]
    assert labels == [LABELS[i % 3] for i in range(n)]


def check_stream(events: list[JobEvent], n: int) -> None:
    """Every result exactly once, ids strictly increasing, ending on the final status."""
    indices = sorted(e.data["index"] for e in events if e.event == "result")
    assert indices == list(range(n))
    ids = [tuple(map(int, e.id.split("-"))) for e in events if e.id]
    assert ids == sorted(set(ids))
    assert events[-1] == JobEvent(events[-1].id, "status", {"status": "completed"})


def test_surfaces_sync(client: Client) -> None:
    body = client.classify(TEXTS, model="kw")
    assert [r["label"] for r in body["results"]] == LABELS and body["labels"] == LABELS
    pair = client.classify({"text": "where is", "text_pair": "my parcel"}, options={"return_meta": True})
    assert pair["results"][0]["label"] == "shipping" and "meta" in pair
    emb = client.embeddings(["refund parcel", "nothing"], model="kw")
    assert emb["object"] == "list" and len(emb["data"]) == 2 and len(emb["data"][0]["embedding"]) > 4
    assert len(client.embeddings("refund parcel", dimensions=4)["data"][0]["embedding"]) == 4
    assert isinstance(client.embeddings("refund", encoding_format="base64")["data"][0]["embedding"], str)
    docs = ["a parcel", "refund please", {"text": "refund the invoice charge"}]
    ranked = client.rerank("refund", docs, top_n=2, return_documents=True)
    assert [r["index"] for r in ranked["results"]] == [1, 2]
    assert ranked["results"][0]["document"] == "refund please"
    assert client.surface("classify", {"input": "parcel"})["results"][0]["label"] == "shipping"
    assert client.models()["data"][0]["id"] == "kw"
    health = client.health()
    assert health["status"] == "ready" and health["models"] == {"kw": {"status": "ready"}}


def test_every_surface_method_posts_to_its_descriptor_route(client: Client) -> None:
    # The keyword model serves no decisions: a 422 shows the route exists and took the body
    # (a wrong path would be a 404, a wrong body shape a 400).
    question = {"q": {"type": "noul", "instructions": "Is it about a parcel?"}}
    with pytest.raises(APIError) as refused:
        client.decisions("Where is my parcel?", question, model="kw")
    assert (refused.value.status, refused.value.code) == (422, "unsupported_surface")
    with pytest.raises(APIError) as by_name:
        client.surface("decisions", {"state": "x", "questions": question})
    assert by_name.value.status == 422
    # A name without a descriptor is posted to /v1/{name}: the decisions alias, here.
    with pytest.raises(APIError) as alias:
        client.surface("systemone", {"state": "x", "questions": question})
    assert alias.value.status == 422
    with pytest.raises(APIError) as unknown:
        client.surface("nonexistent", {"input": "x"})
    assert unknown.value.status == 404


async def test_surfaces_async(server: Server) -> None:
    async with AsyncClient(server.url) as client:
        body = await client.classify(TEXTS)
        assert [r["label"] for r in body["results"]] == LABELS
        assert len((await client.embeddings("refund parcel", dimensions=4))["data"][0]["embedding"]) == 4
        ranked = await client.rerank("refund", ["a parcel", "refund please"], top_n=1)
        assert [r["index"] for r in ranked["results"]] == [1]
        assert (await client.models())["data"][0]["id"] == "kw"
        assert (await client.health())["status"] == "ready"


def test_api_errors_carry_status_code_and_message(client: Client) -> None:
    with pytest.raises(APIError) as missing:
        client.classify("refund", model="nope")
    assert (missing.value.status, missing.value.code) == (404, "model_not_found")
    assert "nope" in missing.value.message
    with pytest.raises(APIError) as invalid:
        client.rerank("q", [], top_n=0)
    assert (invalid.value.status, invalid.value.code) == (400, "invalid_request")
    with pytest.raises(APIError) as job:
        client.job("job_missing")
    assert (job.value.status, job.value.code) == (404, "job_not_found")
    with pytest.raises(APIError) as line:
        client.submit_job([{"input": "ok"}, {"input": 3}], surface="classify")
    assert line.value.code == "invalid_request" and "line 2" in line.value.message


async def test_api_errors_async(server: Server) -> None:
    async with AsyncClient(server.url) as client:
        with pytest.raises(APIError) as missing:
            await client.embeddings("refund", model="nope")
        assert (missing.value.status, missing.value.code) == (404, "model_not_found")
        with pytest.raises(APIError) as events:
            [e async for e in client.job_events("job_missing")]
        assert events.value.code == "job_not_found"


def test_job_submit_wait_results_in_order(client: Client) -> None:
    job = client.submit_job(job_requests(40), surface="classify", model="kw")
    assert job["object"] == "job" and job["counts"]["total"] == 40
    seen: list[dict[str, int]] = []
    final = client.wait_job(job["id"], on_progress=seen.append)
    assert final["status"] == "completed" and final["counts"]["done"] == 40
    assert seen and seen[-1]["done"] == 40
    assert [s["done"] + s["failed"] for s in seen] == sorted(s["done"] + s["failed"] for s in seen)
    check_results(list(client.iter_job_results(job["id"], page_size=7)), 40)
    page = client.job_results(job["id"], offset=38, limit=5)
    assert [r["index"] for r in page["data"]] == [38, 39] and page["has_more"] is False


async def test_job_async_polling_and_on_error_record(server: Server) -> None:
    async with AsyncClient(server.url) as client:
        job = await client.submit_job(
            b'{"input": "refund"}\n{"input": 1}\n', surface="classify", on_error="record"
        )
        final = await client.wait_job(job["id"], poll_s=0.05, events=False)
        assert final["status"] == "completed" and final["counts"]["failed"] == 1
        results = [r async for r in client.iter_job_results(job["id"])]
        assert results[0]["response"]["results"][0]["label"] == "billing"
        assert results[1]["error"]["code"] == "invalid_request" and "line 2" in results[1]["error"]["message"]
        job = await client.submit_job(job_requests(9), surface="classify")
        assert (await client.wait_job(job["id"]))["status"] == "completed"
        check_results([r async for r in client.iter_job_results(job["id"], page_size=4)], 9)


def test_events_resume_after_last_event_id(client: Client) -> None:
    job = client.submit_job(job_requests(12), surface="classify")
    client.wait_job(job["id"])
    events = list(client.job_events(job["id"]))
    check_stream(events, 12)
    resumed = list(client.job_events(job["id"], last_event_id=events[4].id))
    assert resumed == events[5:]


async def test_events_resume_async(server: Server) -> None:
    async with AsyncClient(server.url) as client:
        job = await client.submit_job(job_requests(6), surface="classify")
        events = [e async for e in client.job_events(job["id"])]
        check_stream(events, 6)
        resumed = [e async for e in client.job_events(job["id"], last_event_id=events[2].id)]
        assert resumed == events[3:]


class DroppingProxy:
    """A TCP proxy that cuts its first connection after `cut_after` bytes of the response."""

    def __init__(self, port: int, cut_after: int) -> None:
        self.target, self.cut_after = port, cut_after
        self.requests: list[bytes] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        cut = self.cut_after if not self.requests else None
        with conn, socket.create_connection(("127.0.0.1", self.target)) as upstream:
            request = conn.recv(65536)
            self.requests.append(request)
            upstream.sendall(request)
            sent = 0
            while data := upstream.recv(4096):
                if cut is not None and sent + len(data) >= cut:
                    conn.sendall(data[: cut - sent])
                    return  # mid-chunk: the client sees an incomplete body
                conn.sendall(data)
                sent += len(data)

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def completed_job(client: Client) -> str:
    job = client.submit_job(job_requests(30), surface="classify")
    client.wait_job(job["id"])
    return str(job["id"])


def test_events_reconnect_when_the_connection_drops(server: Server, completed_job: str) -> None:
    proxy = DroppingProxy(server.port, cut_after=1500)
    try:
        with Client(proxy.url) as client:
            events = list(client.job_events(completed_job))
    finally:
        proxy.close()
    check_stream(events, 30)
    assert len(proxy.requests) == 2 and b"last-event-id: " in proxy.requests[1].lower()


async def test_events_reconnect_async(server: Server, completed_job: str) -> None:
    proxy = DroppingProxy(server.port, cut_after=2500)
    try:
        async with AsyncClient(proxy.url) as client:
            events = [e async for e in client.job_events(completed_job)]
    finally:
        proxy.close()
    check_stream(events, 30)
    assert len(proxy.requests) == 2


def test_cancel_stops_the_chunks_not_started(client: Client) -> None:
    # Forty chunks of 256 distinct inputs, three in flight: most are still queued at the cancel.
    total = 40 * 256
    job = client.submit_job([{"input": f"refund {i}"} for i in range(total)], surface="classify")
    assert client.cancel_job(job["id"])["status"] == "cancelling"
    final = client.wait_job(job["id"])
    assert final["status"] == "cancelled" and final["counts"]["failed"] > 0
    results = list(client.iter_job_results(job["id"]))
    assert len(results) == total
    assert {r["error"]["code"] for r in results if "error" in r} == {"cancelled"}


async def test_cancel_async_on_finished_job_keeps_its_status(server: Server) -> None:
    async with AsyncClient(server.url) as client:
        job = await client.submit_job([{"input": "parcel"}], surface="classify")
        await client.wait_job(job["id"])
        assert (await client.cancel_job(job["id"]))["status"] == "completed"


def test_idempotency_key_returns_the_same_job(client: Client) -> None:
    first = client.submit_job(job_requests(3), surface="classify", idempotency_key="client-k1")
    again = client.submit_job(job_requests(3), surface="classify", idempotency_key="client-k1")
    other = client.submit_job(job_requests(3), surface="classify", idempotency_key="client-k2")
    assert again["id"] == first["id"] and other["id"] != first["id"]


def test_api_key_is_sent_as_bearer(start_server: Callable[..., Server], keywords: object) -> None:
    server = start_server(str(keywords), "--api-key", "sekret")
    with Client(server.url, api_key="sekret") as client:
        assert client.classify("refund")["results"][0]["label"] == "billing"
    with Client(server.url) as anonymous, pytest.raises(APIError) as refused:
        anonymous.models()
    assert (refused.value.status, refused.value.code) == (401, "unauthorized")


def test_job_ids_stay_one_path_segment(client: Client) -> None:
    # "../../health" must not reach /health, nor "a b?c#d" query job "a b".
    for job_id in ("../../health", "a b?c#d", "job_x/results"):
        with pytest.raises(APIError) as error:
            client.job(job_id)
        assert error.value.status == 404 and error.value.code in ("job_not_found", "not_found"), job_id


def test_jsonl_text_is_sent_as_lines(client: Client) -> None:
    job = client.submit_job('{"input": "refund"}\n{"input": "parcel"}\n', surface="classify")
    assert job["counts"]["total"] == 2


def test_upstream_fields_reach_the_server(client: Client) -> None:
    """`head`, `layer`, `input_type` and the rerank exit are sent: the server answers or refuses
    each by name (the keyword model has one head, one layer, no prompts and one exit)."""
    assert client.classify("refund", head="keywords")["results"][0]["label"] == "billing"
    with pytest.raises(APIError) as head:
        client.classify("refund", head="nope")
    # The model's refusals (a head, layer, prompt or exit it lacks): 422, naming the field.
    assert (head.value.status, head.value.code) == (422, "unsupported_surface")
    assert "head" in head.value.message
    for fields in ({"layer": 1}, {"input_type": "query"}):
        with pytest.raises(APIError) as refused:
            client.embeddings("refund", **fields)  # type: ignore[arg-type]
        assert refused.value.status == 422 and next(iter(fields)) in refused.value.message
    for name in ("layer", "dimensions"):
        with pytest.raises(APIError) as exit_:
            client.rerank("refund", ["refund"], **{name: 1})  # type: ignore[arg-type]
        assert exit_.value.status == 422 and name in exit_.value.message


def test_bundle_answers_each_task_with_its_own_status(client: Client) -> None:
    body = client.bundle(
        [
            {"id": "c", "classify": {"input": ["refund", "parcel"]}},
            {"id": "e", "embeddings": {"input": "refund", "dimensions": 4}},
            {"id": "bad", "classify": {"input": "refund", "head": "nope"}},
        ],
        deadline_ms=30_000,
    )
    assert [(r["id"], r["status"]) for r in body["results"]] == [("c", 200), ("e", 200), ("bad", 422)]
    assert [r["label"] for r in body["results"][0]["classify"]["results"]] == ["billing", "shipping"]
    assert len(body["results"][1]["embeddings"]["data"][0]["embedding"]) == 4
    assert "head" in body["results"][2]["error"]["message"]
