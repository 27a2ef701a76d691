"""A Python client for a vllm-srun server: every surface and bulk jobs, sync and async.

`Client` and `AsyncClient` expose the same methods. Responses are the server's JSON decoded
to plain dicts (the shapes of the Structs in `vllm_srun.plugins.surfaces` and
`vllm_srun.queue.jobs.JobStatus`), so a field the server adds later reaches the caller
without a client release. Requests are described by `Call` values built by plain functions,
and responses are read by plain functions; the two classes differ only in how they send.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, TypeVar
from urllib.parse import quote

import httpx
import msgspec

DEFAULT_URL = "http://127.0.0.1:8000"
TERMINAL = frozenset({"completed", "failed", "cancelled", "expired"})
# A dropped event stream is resumed this many times in a row before the error is raised; any
# event received resets the count, so a long job survives any number of spaced-out drops.
MAX_RECONNECTS = 5
# What a connection that broke (as opposed to a request the server refused) raises.
DROPPED = (httpx.NetworkError, httpx.TimeoutException, httpx.RemoteProtocolError)

OnProgress = Callable[[dict[str, int]], None]
R = TypeVar("R")


class APIError(Exception):
    """A non-2xx answer: its HTTP status and the server's error `code` and `message`."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class JobEvent(NamedTuple):
    """One Server-Sent Event of a job: `result`, `progress` or `status`, with its JSON data."""

    id: str | None
    event: str
    data: dict[str, Any]


@dataclass(frozen=True)
class Call:
    """One HTTP request, independent of the transport that sends it."""

    method: str
    path: str
    params: dict[str, Any] = field(default_factory=dict)
    json: Any = None
    content: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    # Statuses besides 2xx whose body is an answer rather than an error (/health's 503).
    accept_status: tuple[int, ...] = ()

    def kwargs(self) -> dict[str, Any]:
        return {"params": self.params, "headers": self.headers, "json": self.json, "content": self.content}


def _segment(job_id: str) -> str:
    """A job id as one URL path segment: "../health" or "a b?c" cannot reach another route."""
    return quote(job_id, safe="")


def _body(**fields: Any) -> dict[str, Any]:
    """A request body without the fields left at None, so the server applies its defaults."""
    return {name: value for name, value in fields.items() if value is not None}


def submit_call(
    requests: Iterable[Any] | bytes | str, surface: str, model: str | None, on_error: str, key: str | None
) -> Call:
    # Bytes go as they are, so the server's line numbers are those of the caller's file; so
    # does JSONL text (a str is not an iterable of requests).
    if isinstance(requests, str):
        requests = requests.encode()
    if not isinstance(requests, bytes):
        requests = b"".join(msgspec.json.encode(request) + b"\n" for request in requests)
    headers = {"Content-Type": "application/x-ndjson"}
    if key:
        headers["Idempotency-Key"] = key
    params = _body(surface=surface, model=model, on_error=on_error)
    return Call("POST", "/v1/jobs", params=params, content=requests, headers=headers)


def error_of(response: httpx.Response) -> APIError:
    """The server's `{"error": {"code", "message"}}`, or a stand-in for a body without it."""
    try:
        error = response.json()["error"]
        return APIError(response.status_code, str(error["code"]), str(error["message"]))
    except (ValueError, KeyError, TypeError):
        text = response.text.strip()[:500] or response.reason_phrase
        return APIError(response.status_code, f"http_{response.status_code}", text)


def parse(call: Call, response: httpx.Response) -> dict[str, Any]:
    if not (response.is_success or response.status_code in call.accept_status):
        raise error_of(response)
    body: dict[str, Any] = response.json()
    return body


def next_offset(page: dict[str, Any]) -> int | None:
    """Where the next results page starts; None when this was the last stored one."""
    done = not page["has_more"] or not page["data"]
    return None if done else int(page["offset"]) + len(page["data"])


class EventStream:
    """A job's Server-Sent Events parsed from lines (WHATWG rules, multi-line `data` included),
    and where the stream stands, so a dropped connection resumes after the last whole event."""

    def __init__(self, job_id: str, last_event_id: str | None) -> None:
        self.job_id = job_id
        self.last_id = last_event_id
        self.retry_ms: int | None = None
        self.failures = 0
        self._id, self._event, self._data = last_event_id, "", list[str]()

    def call(self) -> Call:
        """The request that (re)opens the stream; an event cut off by a drop is discarded."""
        self._id, self._event, self._data = self.last_id, "", []
        headers = {"Accept": "text/event-stream"}
        if self.last_id:
            headers["Last-Event-ID"] = self.last_id
        return Call("GET", f"/v1/jobs/{_segment(self.job_id)}/events", headers=headers)

    def feed(self, line: str) -> JobEvent | None:
        """The event a blank line completes, else None."""
        if line.startswith(":"):
            return None  # a comment, used as a keep-alive
        if line:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "data":
                self._data.append(value)
            elif name == "event":
                self._event = value
            elif name == "id" and "\0" not in value:
                self._id = value or None
            elif name == "retry" and value.isdigit():
                self.retry_ms = int(value)
            return None
        text, event, self._event, self._data = "\n".join(self._data), self._event or "message", "", []
        if not text:
            return None
        # Only a whole event moves the resume point: resuming never skips a half-read one.
        self.last_id, self.failures = self._id, 0
        try:
            data = json.loads(text)
        except ValueError:
            data = text
        return JobEvent(self.last_id, event, data if isinstance(data, dict) else {"data": data})

    def dropped(self, exc: Exception) -> float:
        """Seconds to wait before reconnecting; re-raises once drops come too often in a row."""
        if isinstance(exc, httpx.ReadTimeout):
            return 0.0  # the server is there, only quiet (a long chunk): ask again at once
        self.failures += 1
        if self.failures > MAX_RECONNECTS:
            raise exc
        return self.retry_ms / 1000 if self.retry_ms is not None else min(0.1 * 2.0**self.failures, 2.0)


class Waiter:
    """What `wait_job` reports: counts from each event (corrected by `progress`), then polls."""

    def __init__(self, job: dict[str, Any], on_progress: OnProgress | None) -> None:
        self.counts = {"total": job["counts"]["total"], "done": 0, "failed": 0, "cached": 0}
        self.on_progress = on_progress
        self.over = job["status"] in TERMINAL

    def event(self, event: JobEvent) -> None:
        if event.event == "progress":
            self.counts = {k: int(event.data.get(k, v)) for k, v in self.counts.items()}
        elif event.event == "result":
            self.counts["failed" if "error" in event.data else "done"] += 1
        else:
            return
        if self.on_progress is not None:
            self.on_progress(dict(self.counts))

    def polled(self, job: dict[str, Any]) -> bool:
        """Report a polled status; True once the job is over."""
        if self.on_progress is not None:
            self.on_progress(job["counts"])
        return job["status"] in TERMINAL


# The methods, written once: `_send` returns a dict (sync) or a coroutine of one (async).


class _Methods(Generic[R]):
    def _send(self, call: Call) -> R:
        raise NotImplementedError

    def classify(
        self,
        input: Any,
        *,
        model: str | None = None,
        head: str | None = None,
        options: dict[str, Any] | None = None,
    ) -> R:
        """POST /v1/classify: `input` is a text, a `{"text", "text_pair"}` pair, or a list of
        them; `head` names the head to run (default the model's first)."""
        fields = {"model": model, "head": head, "options": options}
        return self._send(Call("POST", "/v1/classify", json=_body(input=input, **fields)))

    def embeddings(
        self,
        input: str | list[str],
        *,
        model: str | None = None,
        encoding_format: str = "float",
        dimensions: int | None = None,
        layer: int | None = None,
        input_type: str | None = None,
        options: dict[str, Any] | None = None,
    ) -> R:
        """POST /v1/embeddings (OpenAI-compatible; `layer` and `input_type` are upstream's)."""
        fields = {
            "encoding_format": encoding_format,
            "dimensions": dimensions,
            "layer": layer,
            "input_type": input_type,
            "options": options,
        }
        return self._send(Call("POST", "/v1/embeddings", json=_body(input=input, model=model, **fields)))

    def rerank(
        self,
        query: str,
        documents: list[Any],
        *,
        model: str | None = None,
        top_n: int | None = None,
        return_documents: bool = False,
        layer: int | None = None,
        dimensions: int | None = None,
        options: dict[str, Any] | None = None,
    ) -> R:
        """POST /v1/rerank: `documents` are texts or `{"text"}` objects; a returned `document` is
        the document's text. `layer` and `dimensions` name the scorer's exit (upstream's)."""
        fields = {
            "model": model,
            "top_n": top_n,
            "return_documents": return_documents,
            "layer": layer,
            "dimensions": dimensions,
            "options": options,
        }
        return self._send(Call("POST", "/v1/rerank", json=_body(query=query, documents=documents, **fields)))

    def decisions(
        self,
        state: str | dict[str, Any] | None,
        questions: dict[str, Any],
        *,
        states: dict[str, Any] | None = None,
        model: str | None = None,
        options: dict[str, Any] | None = None,
    ) -> R:
        """POST /v1/decisions: `questions` ({id: {type, instructions, …}}) about `state`, and
        about each of `states` ({name: {state, questions}})."""
        fields = {"states": states, "model": model, "options": options}
        return self._send(
            Call("POST", "/v1/decisions", json=_body(state=state, questions=questions, **fields))
        )

    def bundle(self, tasks: list[dict[str, Any]], *, deadline_ms: float | None = None) -> R:
        """POST /v1/bundle: `tasks` are `{"id", <surface>: <that surface's request body>}`; the
        answer has one `{"id", "status", <surface> | "error"}` per task, in task order (a task's
        own failure is its status, not an exception)."""
        options = None if deadline_ms is None else {"deadline_ms": deadline_ms}
        return self._send(Call("POST", "/v1/bundle", json=_body(tasks=tasks, options=options)))

    def surface(self, name: str, body: dict[str, Any]) -> R:
        """POST `body` as is to surface `name`'s own route: any surface, including those without
        a method here: every surface's own route is /v1/{name}."""
        return self._send(Call("POST", f"/v1/{name}", json=body))

    def models(self) -> R:
        """GET /v1/models: served models and installed plugins."""
        return self._send(Call("GET", "/v1/models"))

    def health(self) -> R:
        """GET /health: `{"api_version", "status", "models": {name: {"status", "reason"}}, ...}`
        (a status other than ready, answered 503, is no error)."""
        return self._send(Call("GET", "/health", accept_status=(503,)))

    def submit_job(
        self,
        requests: Iterable[Any] | bytes | str,
        *,
        surface: str,
        model: str | None = None,
        on_error: str = "reject",
        idempotency_key: str | None = None,
    ) -> R:
        """POST /v1/jobs as JSONL: one surface request per item (a dict may carry `custom_id`).

        `requests` may also be JSONL bytes or text, sent unchanged. Returns the job's status; with an
        `idempotency_key` the server already knows, that key's job.
        """
        return self._send(submit_call(requests, surface, model, on_error, idempotency_key))

    def job(self, job_id: str) -> R:
        """GET /v1/jobs/{id}: status, counts and times."""
        return self._send(Call("GET", f"/v1/jobs/{_segment(job_id)}"))

    def job_results(self, job_id: str, offset: int = 0, limit: int = 1000) -> R:
        """One page of results in input order: `{"data", "offset", "total", "has_more"}`."""
        return self._send(
            Call("GET", f"/v1/jobs/{_segment(job_id)}/results", params={"offset": offset, "limit": limit})
        )

    def cancel_job(self, job_id: str) -> R:
        """POST /v1/jobs/{id}/cancel: requests not yet run answer `cancelled`."""
        return self._send(Call("POST", f"/v1/jobs/{_segment(job_id)}/cancel"))


# The host a request over a unix socket names (the router's client names one of its own too).
UNIX_HOST = "http://vllm-srun"


def endpoint(url: str) -> tuple[str, str | None]:
    """An endpoint as the router writes one — `http://host:port`, `https://...` or
    `unix:///path/to.sock` — as (base URL, unix socket path or None)."""
    if url.startswith("unix://"):
        path = url.removeprefix("unix://")
        if not path.startswith("/"):
            raise ValueError(f"endpoint {url!r}: a unix endpoint is unix:///absolute/path.sock")
        return UNIX_HOST, path
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"endpoint {url!r} must use unix://, http:// or https://")
    return url.rstrip("/"), None


def http_options(
    url: str, api_key: str | None = None, timeout_s: float = 60.0, *, asynchronous: bool = False
) -> dict[str, Any]:
    """What an httpx client for endpoint `url` takes: base URL, key, timeout and, for a unix
    socket, the transport that dials it."""
    base_url, uds = endpoint(url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    options: dict[str, Any] = {"base_url": base_url, "headers": headers, "timeout": timeout_s}
    if uds is not None:
        transport = httpx.AsyncHTTPTransport if asynchronous else httpx.HTTPTransport
        options["transport"] = transport(uds=uds)
    return options


class Client(_Methods[dict[str, Any]]):
    """A blocking client of `base_url` (`http://`, `https://` or `unix:///path.sock`); use as a
    context manager or call `close`."""

    def __init__(self, base_url: str = DEFAULT_URL, *, api_key: str | None = None, timeout_s: float = 60.0):
        self.base_url = base_url
        self._http = httpx.Client(**http_options(base_url, api_key, timeout_s))

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, call: Call) -> dict[str, Any]:
        return parse(call, self._http.request(call.method, call.path, **call.kwargs()))

    def iter_job_results(self, job_id: str, page_size: int = 1000) -> Iterator[dict[str, Any]]:
        """Every stored result in input order, page by page (after `wait_job`, all of them)."""
        offset: int | None = 0
        while offset is not None:
            page = self.job_results(job_id, offset, page_size)
            yield from page["data"]
            offset = next_offset(page)

    def job_events(self, job_id: str, last_event_id: str | None = None) -> Iterator[JobEvent]:
        """The job's events after `last_event_id` until its final status, across dropped connections."""
        stream = EventStream(job_id, last_event_id)
        while True:
            call = stream.call()
            try:
                with self._http.stream(call.method, call.path, **call.kwargs()) as response:
                    if not response.is_success:
                        response.read()
                        raise error_of(response)
                    for event in filter(None, map(stream.feed, response.iter_lines())):
                        yield event
                        if event.event == "status":
                            return
                return  # the server ended the stream: the job was already over
            except DROPPED as exc:
                time.sleep(stream.dropped(exc))

    def wait_job(
        self, job_id: str, *, poll_s: float = 1.0, on_progress: OnProgress | None = None, events: bool = True
    ) -> dict[str, Any]:
        """Block until the job ends and return its final status; `on_progress(counts)` on the way.

        Progress comes from the event stream; if that cannot be followed (or `events` is False),
        from polling the status every `poll_s` seconds.
        """
        waiter = Waiter(self.job(job_id), on_progress)
        if events and not waiter.over:
            with contextlib.suppress(APIError, httpx.TransportError):  # then polling takes over
                for event in self.job_events(job_id):
                    waiter.event(event)
        while not waiter.polled(job := self.job(job_id)):
            time.sleep(poll_s)
        return job


class AsyncClient(_Methods[Coroutine[Any, Any, dict[str, Any]]]):
    """The asyncio client: the same methods as `Client`, awaited; `aclose` when done."""

    def __init__(self, base_url: str = DEFAULT_URL, *, api_key: str | None = None, timeout_s: float = 60.0):
        self.base_url = base_url
        self._http = httpx.AsyncClient(**http_options(base_url, api_key, timeout_s, asynchronous=True))

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, call: Call) -> dict[str, Any]:
        return parse(call, await self._http.request(call.method, call.path, **call.kwargs()))

    async def iter_job_results(self, job_id: str, page_size: int = 1000) -> AsyncIterator[dict[str, Any]]:
        """Every stored result in input order, page by page (after `wait_job`, all of them)."""
        offset: int | None = 0
        while offset is not None:
            page = await self.job_results(job_id, offset, page_size)
            for item in page["data"]:
                yield item
            offset = next_offset(page)

    async def job_events(self, job_id: str, last_event_id: str | None = None) -> AsyncIterator[JobEvent]:
        """The job's events after `last_event_id` until its final status, across dropped connections."""
        stream = EventStream(job_id, last_event_id)
        while True:
            call = stream.call()
            try:
                async with self._http.stream(call.method, call.path, **call.kwargs()) as response:
                    if not response.is_success:
                        await response.aread()
                        raise error_of(response)
                    async for line in response.aiter_lines():
                        if event := stream.feed(line):
                            yield event
                            if event.event == "status":
                                return
                return
            except DROPPED as exc:
                await asyncio.sleep(stream.dropped(exc))

    async def wait_job(
        self, job_id: str, *, poll_s: float = 1.0, on_progress: OnProgress | None = None, events: bool = True
    ) -> dict[str, Any]:
        """Wait until the job ends and return its final status; see `Client.wait_job`."""
        waiter = Waiter(await self.job(job_id), on_progress)
        if events and not waiter.over:
            with contextlib.suppress(APIError, httpx.TransportError):  # then polling takes over
                async for event in self.job_events(job_id):
                    waiter.event(event)
        while not waiter.polled(job := await self.job(job_id)):
            await asyncio.sleep(poll_s)
        return job
