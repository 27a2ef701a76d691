"""Checks one HTTP response against the upstream contract (tests/contract/schema.py).

`check(method, path, status, body, headers)` picks the component by route and status, as
upstream's document does, and returns the violations as readable lines (empty: the response is
one a client generated from upstream's document decodes). Routes upstream does not define
(jobs, the OpenAI/TEI/Cohere routes of their own, /v1/models/{id}) are not checked.

Statuses upstream documents on a route must carry its ErrorResponse, `code` from its enum.
Statuses it does not document there (401 for `--api-key`, 405) are this server's additions: their
body must still be an ErrorResponse, with a code of its own.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from functools import cache
from typing import Any

from contract.schema import API_VERSION, SERVER_TIMING_PHASES, document
from jsonschema import Draft202012Validator

_SURFACE_ERRORS = frozenset({400, 404, 413, 422, 429, 500, 503})

# (method, path) -> (component of a 200, statuses that carry upstream's ErrorResponse)
ROUTES: dict[tuple[str, str], tuple[str, frozenset[int]]] = {
    ("POST", "/v1/decisions"): ("DecisionResponse", _SURFACE_ERRORS),
    ("POST", "/v1/systemone"): ("DecisionResponse", _SURFACE_ERRORS),
    ("POST", "/v1/classify"): ("ClassifyResponse", _SURFACE_ERRORS),
    ("POST", "/v1/embeddings"): ("EmbeddingsResponse", _SURFACE_ERRORS),
    ("POST", "/v1/rerank"): ("RerankResponse", _SURFACE_ERRORS),
    ("POST", "/v1/bundle"): ("BundleResponse", frozenset({400, 413, 500})),
    ("GET", "/v1/models"): ("ModelList", frozenset()),
    ("GET", "/health"): ("Health", frozenset()),
    ("GET", "/health/live"): ("Liveness", frozenset()),
}
# Routes whose every response carries Server-Timing with upstream's phases.
TIMED = frozenset(path for (method, path) in ROUTES if method == "POST")
BUNDLE_SURFACES = ("decisions", "classify", "embeddings", "rerank")

# A status upstream does not document on the route: an error body all the same, any code.
_OWN_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
        }
    },
}


def upstream_path(path: str) -> str | None:
    """`path` (query string dropped, one trailing slash allowed) if upstream defines it."""
    path = path.split("?", 1)[0]
    if path != "/" and path.endswith("/"):
        path = path[:-1]
    if path == "/metrics" or any(p == path for (_, p) in ROUTES):
        return path
    return None


@cache
def _validator(component: str) -> Draft202012Validator:
    return Draft202012Validator(document(component))


def schema_violations(component: str, body: Any) -> list[str]:
    """Where `body` breaks upstream's `component`, one line per error, at its JSON path."""
    errors = sorted(_validator(component).iter_errors(body), key=lambda e: list(e.absolute_path))
    return [f"{component} at {_where(e.absolute_path)}: {e.message[:300]}" for e in errors]


def _where(parts: Any) -> str:
    out = "$"
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def server_timing_violations(value: str | None) -> list[str]:
    """Upstream's ServerTiming header: a W3C Server-Timing list with every phase's `dur` (ms)."""
    if value is None:
        return ["Server-Timing header missing"]
    durations: dict[str, float] = {}
    problems = []
    for entry in value.split(","):
        name, *params = (part.strip() for part in entry.split(";"))
        if not re.fullmatch(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+", name):
            problems.append(f"Server-Timing entry {entry.strip()!r} has no metric name")
            continue
        for param in params:
            key, _, raw = param.partition("=")
            if key.strip() == "dur":
                try:
                    durations[name] = float(raw)
                except ValueError:
                    problems.append(f"Server-Timing {name}: dur {raw!r} is not a number")
    missing = [phase for phase in SERVER_TIMING_PHASES if phase not in durations]
    if missing:
        problems.append(f"Server-Timing {value!r} lacks the phases {missing}")
    problems += [
        f"Server-Timing {phase}: dur {durations[phase]} < 0"
        for phase in SERVER_TIMING_PHASES
        if durations.get(phase, 0.0) < 0
    ]
    return problems


def _classify_label_order(body: Any) -> list[str]:
    """ClassifyResponse.labels is the order of every probabilities and scores list."""
    if not isinstance(body, dict) or not isinstance(body.get("labels"), list):
        return []
    width, problems = len(body["labels"]), []
    for i, result in enumerate(body.get("results") or []):
        if not isinstance(result, dict):
            continue
        rows = [(f"results[{i}].{k}", result.get(k)) for k in ("probabilities", "scores")]
        for j, token in enumerate(result.get("tokens") or []):
            rows.append((f"results[{i}].tokens[{j}].probabilities", _get(token, "probabilities")))
        for j, window in enumerate(result.get("windows") or []):
            rows += [(f"results[{i}].windows[{j}].{k}", _get(window, k)) for k in ("probabilities", "scores")]
        problems += [
            f"ClassifyResponse at $.{where}: {len(row)} values for {width} labels"
            for where, row in rows
            if isinstance(row, list) and len(row) != width
        ]
    return problems


def _get(value: Any, key: str) -> Any:
    return value.get(key) if isinstance(value, dict) else None


def _bundle_results(body: Any) -> list[str]:
    """BundleResult: on status 200 its surface field holds the response, otherwise error is set."""
    problems = []
    results = body.get("results") if isinstance(body, dict) else None
    for i, result in enumerate(results if isinstance(results, list) else []):
        if not isinstance(result, dict):
            continue
        surfaces = [s for s in BUNDLE_SURFACES if s in result]
        if result.get("status") == 200:
            if len(surfaces) != 1 or "error" in result:
                problems.append(f"BundleResult at $.results[{i}]: status 200 with surfaces {surfaces}")
        elif "error" not in result or surfaces:
            problems.append(
                f"BundleResult at $.results[{i}]: status {result.get('status')} needs error and no surface"
            )
    return problems


def _readiness(component: str, status: int, body: Any) -> list[str]:
    if not isinstance(body, dict):
        return []
    problems = []
    if "api_version" in body and body["api_version"] != API_VERSION:
        problems.append(f"{component}: api_version {body['api_version']!r}, not {API_VERSION!r}")
    if component == "Health" and (status == 200) != (body.get("status") == "ready"):
        problems.append(f"Health: status {body.get('status')!r} answered with HTTP {status}")
    return problems


def _numbers_only(vector: list[Any]) -> bool:
    return set(map(type, vector)) <= {float, int}


def _light_vectors(body: Any) -> Any:
    """`body` with every float embedding that is all numbers emptied: the schema then checks the
    rest, without walking each float of long vectors (a 32 x 384 response would take 0.1 s)."""

    def light_embeddings(response: Any) -> Any:
        data = response.get("data") if isinstance(response, dict) else None
        if not isinstance(data, list):
            return response
        items = [
            {**item, "embedding": []}
            if isinstance(item, dict)
            and isinstance(item.get("embedding"), list)
            and _numbers_only(item["embedding"])
            else item
            for item in data
        ]
        return {**response, "data": items}

    if not isinstance(body, dict):
        return body
    if isinstance(body.get("results"), list):  # a bundle
        results = [
            {**r, "embeddings": light_embeddings(r["embeddings"])}
            if isinstance(r, dict) and "embeddings" in r
            else r
            for r in body["results"]
        ]
        return {**body, "results": results}
    return light_embeddings(body)


def _decode(body: Any) -> tuple[Any, str | None]:
    if isinstance(body, bytes | bytearray | str):
        try:
            return json.loads(body), None
        except ValueError:
            return (
                None,
                f"body is not JSON: {bytes(body[:120]) if not isinstance(body, str) else body[:120]!r}",
            )
    return body, None


def check(method: str, path: str, status: int, body: Any, headers: Mapping[str, str]) -> list[str]:
    """The ways this response breaks upstream's contract; [] if it keeps it or the route is not upstream's.

    `body` is the raw body (bytes or str) or its decoded JSON; `headers` any case-insensitive or
    lower-case mapping (httpx.Headers works as is)."""
    route = upstream_path(path)
    if route is None:
        return []
    lower = {k.lower(): v for k, v in headers.items()}
    content_type = lower.get("content-type", "")
    if route == "/metrics":
        if method == "GET" and status == 200 and not content_type.startswith("text/plain"):
            return [f"/metrics content-type {content_type!r}, not text/plain"]
        return []
    if (method, route) not in ROUTES:
        return []
    component, error_statuses = ROUTES[(method, route)]
    problems: list[str] = []
    if route in TIMED:
        problems += server_timing_violations(lower.get("server-timing"))
    decoded, undecodable = _decode(body)
    if undecodable:
        return [*problems, undecodable]
    if not content_type.startswith("application/json"):
        problems.append(f"content-type {content_type!r}, not application/json")
    if status == 200 or (route == "/health" and status == 503):
        light = _light_vectors(decoded) if component in ("EmbeddingsResponse", "BundleResponse") else decoded
        problems += schema_violations(component, light)
        if component == "ClassifyResponse":
            problems += _classify_label_order(decoded)
        elif component == "BundleResponse":
            problems += _bundle_results(decoded)
            for i, result in enumerate(decoded.get("results") or [] if isinstance(decoded, dict) else []):
                if isinstance(result, dict) and result.get("classify") is not None:
                    problems += [
                        f"$.results[{i}].classify: {p}" for p in _classify_label_order(result["classify"])
                    ]
        problems += _readiness(component, status, decoded)
    elif status in error_statuses:
        problems += schema_violations("ErrorResponse", decoded)
    elif status >= 400:
        problems += [
            f"own error at {_where(e.absolute_path)}: {e.message[:300]}"
            for e in Draft202012Validator(_OWN_ERROR).iter_errors(decoded)
        ]
    else:
        problems.append(f"status {status} is not one upstream documents")
    return [f"{method} {route} {status}: {p}" for p in problems]
