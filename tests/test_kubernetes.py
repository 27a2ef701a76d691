"""deploy/kubernetes renders and every object validates against the Kubernetes schemas.

`kubernetes-validate` bundles the API's JSON schemas, so this runs offline. The base is plain
YAML files listed in kustomization.yaml; `render` applies the two kustomize fields it uses
(`resources`, `namespace`) and refuses any other, so a field it would ignore cannot slip in.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from helpers import REPO

BASE = REPO / "deploy" / "kubernetes" / "base"
# The oldest and newest Kubernetes the manifests are checked against (autoscaling/v2 is GA from 1.23).
VERSIONS = ("1.27.0", kubernetes_validate.latest_version())
CLUSTER_SCOPED = {"Namespace"}


def render(directory: Path) -> list[dict[str, Any]]:
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(spec) - {"apiVersion", "kind", "namespace", "resources"}
    assert not unknown, f"render() does not apply {sorted(unknown)}: extend it or use kustomize"
    objects = []
    for name in spec["resources"]:
        objects += [doc for doc in yaml.safe_load_all((directory / name).read_text()) if doc]
    for obj in objects:
        if spec.get("namespace") and obj["kind"] not in CLUSTER_SCOPED:
            obj["metadata"]["namespace"] = spec["namespace"]
    return objects


def validate(obj: dict[str, Any]) -> None:
    for version in VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return render(BASE)


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


def container(workload: dict[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def test_every_object_validates(objects: list[dict[str, Any]]) -> None:
    assert len(objects) == 9
    for obj in objects:
        validate(obj)


@pytest.mark.parametrize(
    "breakage",
    [
        lambda o: find(o, "Deployment", "app")["spec"]["template"]["spec"]["containers"][0].update(
            ports=[{"containerPort": "eight thousand"}]
        ),
        lambda o: find(o, "StatefulSet", "state-redis")["spec"].update(volumeClaimTemplate=[]),
        lambda o: find(o, "HorizontalPodAutoscaler", "worker")["spec"].update(minReplicas="one"),
    ],
)
def test_a_broken_object_fails(objects: list[dict[str, Any]], breakage: Any) -> None:
    broken = copy.deepcopy(objects)
    breakage(broken)
    with pytest.raises(kubernetes_validate.ValidationError):
        for obj in broken:
            validate(obj)


def test_probes_and_topology(objects: list[dict[str, Any]]) -> None:
    app = container(find(objects, "Deployment", "app"))
    assert app["readinessProbe"]["httpGet"]["path"] == "/health"
    assert app["livenessProbe"]["httpGet"]["path"] == "/health/live"
    state = find(objects, "StatefulSet", "state-redis")
    args = container(state)["args"]
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    assert args[args.index("--appendonly") + 1] == "yes" and "everysec" in args
    assert state["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    cache = container(find(objects, "Deployment", "cache-redis"))["args"]
    assert cache[cache.index("--maxmemory-policy") + 1] == "allkeys-lru"
    for kind, name in (("Service", "state-redis"), ("Service", "cache-redis"), ("Service", "app")):
        find(objects, kind, name)
    assert all(o["metadata"].get("namespace") == "vllm-srun" for o in objects if o["kind"] != "Namespace")


def test_the_commands_are_ones_the_cli_takes(objects: list[dict[str, Any]]) -> None:
    from vllm_srun.cli import build_parser

    for name in ("app", "worker"):
        args = container(find(objects, "Deployment", name))["args"]
        # The image's entrypoint puts the model right after the command.
        parsed = build_parser().parse_args([args[0], "/models/default", *args[1:]])
        assert parsed.redis == "redis://state-redis:6379/0"
        assert parsed.cache_redis == "redis://cache-redis:6379/0" and parsed.strict_redis


def test_workers_scale_on_the_queue_depth_the_runtime_exports(objects: list[dict[str, Any]]) -> None:
    from vllm_srun.stat_loggers.prometheus import PrometheusStatLogger

    hpa = find(objects, "HorizontalPodAutoscaler", "worker")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "worker"
    metric = hpa["spec"]["metrics"][0]["external"]["metric"]["name"]
    names = {m.name for m in PrometheusStatLogger().registry.collect()}
    assert metric in names


def mebibytes(quantity: str) -> float:
    number, unit = re.fullmatch(r"(\d+)(Mi|Gi)", quantity).groups()  # type: ignore[union-attr]
    return int(number) * (1024 if unit == "Gi" else 1)


def test_memory_requests_cover_the_bench_measured_rss(objects: list[dict[str, Any]]) -> None:
    reports = sorted((REPO / "bench" / "reference").glob("*.txt"))
    assert reports
    text = reports[-1].read_text()
    server_mb = int(re.search(r"server peak RSS (\d+) MB", text).group(1))  # type: ignore[union-attr]
    app_mb = int(re.search(r"app replica RSS (\d+) MB", text).group(1))  # type: ignore[union-attr]
    to_mib = 1000 * 1000 / (1024 * 1024)
    app = container(find(objects, "Deployment", "app"))["resources"]
    worker = container(find(objects, "Deployment", "worker"))["resources"]
    assert mebibytes(app["requests"]["memory"]) >= app_mb * to_mib
    # The whole embedded server bounds a worker: it is the worker plus an app and a Redis.
    assert mebibytes(worker["requests"]["memory"]) >= server_mb * to_mib
    assert mebibytes(worker["limits"]["memory"]) > mebibytes(worker["requests"]["memory"])
