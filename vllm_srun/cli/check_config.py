"""`vllm-srun check-config`: ask each endpoint a router.yaml names whether it serves its part.

Each `model_runtime` deployment with an `endpoint` must serve its model, ready, on its device;
each decision signal bound to one must be answered there, asked once as the router will ask it.
Prints one `ok`/`FAIL` line per check; exit 0 when all pass, 1 otherwise, 2 on a malformed file.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vllm_srun import defaults
from vllm_srun.cli.options import SECONDS
from vllm_srun.cli.parsing import reads
from vllm_srun.cli.secrets import API_KEY_ENV

if TYPE_CHECKING:
    from vllm_srun.cli.router_config import CatalogDeployment


def add_parsers(sub: Any) -> None:
    check = sub.add_parser(
        "check-config", help="check a router.yaml's endpoints and decision signals against what they serve"
    )
    check.add_argument("config", type=Path, help="the router configuration")
    reads(
        check.add_argument("--api-key", default=os.environ.get(API_KEY_ENV), help="key for the endpoints"),
        API_KEY_ENV,
    )
    check.add_argument(
        "--timeout-s", type=SECONDS, default=defaults.CHECK_TIMEOUT_S, help="per-endpoint timeout"
    )


def cmd_check_config(args: argparse.Namespace) -> int:
    """Each endpoint deployment serves its model, then each decision signal bound to one is
    answered there; a malformed signal is a configuration error before anything is asked."""
    signals = check_signals(args.config, timeout_s=args.timeout_s, api_key=args.api_key)
    checks = check_endpoints(args.config, timeout_s=args.timeout_s, api_key=args.api_key) + signals
    for check in checks:
        print(f"{'ok  ' if check.ok else 'FAIL'} {check.deployment} @ {check.endpoint}: {check.detail}")
    if not checks:
        print("no model_runtime deployment with an endpoint to check")
    return 0 if all(c.ok for c in checks) else 1


@dataclass(frozen=True)
class Check:
    """One line of the report: a deployment (or a decision signal) and what its endpoint said."""

    deployment: str
    endpoint: str
    ok: bool
    detail: str


def check_endpoints(
    path: Path, *, timeout_s: float = defaults.CHECK_TIMEOUT_S, api_key: str | None = None
) -> list[Check]:
    """For each deployment with an endpoint (`http(s)://` or `unix:///path.sock`): is its model
    served there, on its device?"""
    import httpx

    from vllm_srun.cli.router_config import router_deployments
    from vllm_srun.client import http_options

    checks = []
    for d in router_deployments(path):
        if not d.endpoint:
            continue
        url = d.endpoint.rstrip("/") + "/v1/models"
        try:
            with httpx.Client(**http_options(d.endpoint, api_key, timeout_s)) as http:
                response = http.get("/v1/models")
            response.raise_for_status()
            served = _by_name(response.json()["data"])
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            checks.append(Check(d.name, d.endpoint, False, f"cannot read {url}: {exc}"))
            continue
        checks.append(_judge(d, served))
    return checks


def check_signals(
    path: Path, *, timeout_s: float = defaults.CHECK_TIMEOUT_S, api_key: str | None = None
) -> list[Check]:
    """For each decision signal bound to a deployment with an endpoint: does that runtime
    answer its question? It is asked once, about a fixed state, as the router will ask it; an
    unknown preset or a question type the model does not declare fails as it would there."""
    import httpx

    from vllm_srun.cli.router_config import decision_signals
    from vllm_srun.client import http_options

    checks = []
    for signal in decision_signals(path):
        d = signal.deployment
        if not d.endpoint:
            continue
        url = d.endpoint.rstrip("/") + "/v1/decisions"
        body = {"model": d.served_name, "state": "check-config", "questions": {signal.name: signal.question}}
        label = f"decision {signal.name}"
        try:
            with httpx.Client(**http_options(d.endpoint, api_key, timeout_s)) as http:
                response = http.post("/v1/decisions", json=body)
            answered = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            checks.append(Check(label, d.endpoint, False, f"cannot ask {url}: {exc}"))
            continue
        checks.append(_judge_answer(label, d, signal.name, response.status_code, answered))
    return checks


def _judge_answer(label: str, d: CatalogDeployment, name: str, status: int, body: Any) -> Check:
    assert d.endpoint is not None
    if status != 200 or not isinstance(body, dict):
        error = body.get("error", {}) if isinstance(body, dict) else {}
        message = error.get("message", body) if isinstance(error, dict) else body
        return Check(label, d.endpoint, False, f"{d.served_name!r} refused it ({status}): {message}")
    answer = body.get("answers", {}).get(name)
    if isinstance(answer, dict) and answer.get("error"):
        return Check(label, d.endpoint, False, f"{answer['error']}: {answer.get('message', '')}")
    kind = "set" if name in (body.get("sets") or {}) else (answer or {}).get("type", "?")
    return Check(label, d.endpoint, True, f"{d.served_name!r} answers it ({kind})")


def _by_name(models: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """/v1/models' entries by id and by each alias (an alias reaches its model there too)."""
    out = {alias: m for m in models for alias in m.get("aliases") or []}
    return {**out, **{m["id"]: m for m in models}}


def _judge(d: CatalogDeployment, served: dict[str, dict[str, Any]]) -> Check:
    assert d.endpoint is not None
    available = ", ".join(
        f"{name} on {m.get('device', '?')} ({m.get('state', '?')})"
        for name, m in served.items()
        if name == m["id"]
    )
    model = served.get(d.served_name)
    if model is None:
        return Check(
            d.name,
            d.endpoint,
            False,
            f"{d.served_name!r} is not served there; it serves: {available or 'nothing'}",
        )
    device = str(model.get("device", ""))
    if d.device != "auto" and device.partition(":")[0] != d.device.partition(":")[0]:
        return Check(
            d.name,
            d.endpoint,
            False,
            f"{d.served_name!r} runs on {device}, not {d.device}; it serves: {available}",
        )
    if model.get("state") != "ready":
        return Check(
            d.name, d.endpoint, False, f"{d.served_name!r} is {model.get('state')}: {model.get('reason', '')}"
        )
    return Check(d.name, d.endpoint, True, f"{d.served_name!r} is ready on {device}")
