"""Every response the suite receives on upstream's paths is checked against upstream's contract.

`upstream_contract` (an autouse session fixture, installed by tests/conftest.py) wraps
`httpx.Client.send` and `httpx.AsyncClient.send`: helpers.Server, `httpx.get/post`, the openai and
cohere clients and Litestar's test clients all send through them. Each violation is recorded with
the test that was running; the terminal summary lists them, grouped. With `ENFORCE` a violation
also fails the test whose response it was (after the test body has passed, so a test's own failure
is never hidden).

A test whose HTTP peers are not this server (toy upstreams behind `vllm-srun proxy`) says so with
`@pytest.mark.contract_exempt("why")`; its responses are not checked.

Set `CONTRACT_REPORT=<file>` to have the violations written there as JSON lines as well.
"""

from __future__ import annotations

import json
import os
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from contract.validator import check

# False while the server's bodies are still being brought to the contract: violations are
# listed, not failed. True once they are: a violation then fails the test that met it.
ENFORCE = True


@dataclass(frozen=True)
class Violation:
    test: str
    line: str


class ContractLog:
    """The violations seen in this session, in order, and which test was running."""

    def __init__(self) -> None:
        self.violations: list[Violation] = []
        self.current = "<session>"
        self.exempt = False
        self.checked = 0
        self._lock = threading.Lock()

    def observe(self, response: httpx.Response) -> None:
        if self.exempt:
            return
        try:
            body = response.content
        except httpx.ResponseNotRead:  # a streamed response: its body belongs to the caller
            return
        request = response.request
        try:
            lines = check(request.method, request.url.path, response.status_code, body, response.headers)
        except Exception as exc:  # the check must never break the test it watches
            lines = [f"{request.method} {request.url.path}: the contract check failed: {exc!r}"]
        with self._lock:
            self.checked += 1
            self.violations += [Violation(self.current, line) for line in lines]

    def since(self, mark: int, test: str) -> list[str]:
        return [v.line for v in self.violations[mark:] if v.test == test]


LOG = ContractLog()
_marks: dict[str, int] = {}


@pytest.fixture(scope="session", autouse=True)
def upstream_contract() -> Iterator[ContractLog]:
    """Wrap httpx's two send methods for the whole session; see the module docstring."""
    sync_send, async_send = httpx.Client.send, httpx.AsyncClient.send

    def send(self: httpx.Client, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        response = sync_send(self, request, **kwargs)
        LOG.observe(response)
        return response

    async def asend(self: httpx.AsyncClient, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        response = await async_send(self, request, **kwargs)
        LOG.observe(response)
        return response

    httpx.Client.send = send  # type: ignore[method-assign]
    httpx.AsyncClient.send = asend  # type: ignore[method-assign]
    try:
        yield LOG
    finally:
        httpx.Client.send = sync_send  # type: ignore[method-assign]
        httpx.AsyncClient.send = async_send  # type: ignore[method-assign]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "contract_exempt(reason): the test's HTTP peers are not this server; not checked"
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    LOG.current = item.nodeid
    LOG.exempt = item.get_closest_marker("contract_exempt") is not None
    _marks[item.nodeid] = len(LOG.violations)
    try:
        return (yield)
    finally:
        LOG.current, LOG.exempt = "<session>", False


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    result = yield
    found = LOG.since(_marks.get(item.nodeid, 0), item.nodeid)
    if ENFORCE and found:
        shown = "\n  ".join(found[:20])
        raise AssertionError(f"{len(found)} violations of upstream's contract 2.3.0:\n  {shown}")
    return result


def pytest_sessionfinish(session: pytest.Session) -> None:
    """On an xdist worker: hand this worker's log to the controller, whose summary adds them."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["upstream_contract"] = {
            "checked": LOG.checked,
            "violations": [[v.test, v.line] for v in LOG.violations],
        }


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """On the xdist controller: a worker's log joins this process's (its summary is the run's)."""
    got = getattr(node, "workeroutput", {}).get("upstream_contract")
    if got:
        with LOG._lock:
            LOG.checked += got["checked"]
            LOG.violations += [Violation(test, line) for test, line in got["violations"]]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not LOG.checked:
        return
    counts = Counter(v.line for v in LOG.violations)
    tests = {v.line: v.test for v in reversed(LOG.violations)}
    terminalreporter.section("upstream contract 2.3.0")
    terminalreporter.write_line(
        f"{LOG.checked} responses checked, {len(LOG.violations)} violations, {len(counts)} distinct"
        + ("" if ENFORCE else " (ENFORCE is off: listed, not failed)")
    )
    for line, count in counts.most_common():
        terminalreporter.write_line(f"{count:5d}x {line}  [first in {tests[line]}]")
    path = os.environ.get("CONTRACT_REPORT")
    if path:
        with open(path, "a") as out:
            for v in LOG.violations:
                out.write(json.dumps({"test": v.test, "violation": v.line}) + "\n")
