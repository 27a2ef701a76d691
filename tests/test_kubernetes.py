"""deploy/kubernetes renders and every object validates against the Kubernetes schemas.

`kubernetes-validate` bundles the API's JSON schemas, so this runs offline. The base is plain
YAML files listed in kustomization.yaml; `render` applies the two kustomize fields it uses
(`resources`, `namespace`) and refuses any other, so a field it would ignore cannot slip in.
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
import time
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from helpers import REPO, free_port

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
    assert len(objects) == 10
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


def test_the_commands_are_ones_the_cli_takes(objects: list[dict[str, Any]], tmp_path: Path) -> None:
    from vllm_srun.cli.main import build_parser

    for name in ("app", "worker"):
        args = container(find(objects, "Deployment", name))["args"]
        # The image's entrypoint puts the model right after the command.
        parsed = build_parser().parse_args([args[0], "/models/default", *args[1:]])
        assert parsed.redis == "redis://state-redis:6379/0"
        assert parsed.cache_redis == "redis://cache-redis:6379/0" and parsed.strict_redis
        # The password is the Secret's file, named in the environment: the CLI adds it to both URLs.
        workload = find(objects, "Deployment", name)
        env = {e["name"]: e for e in container(workload)["env"]}
        assert secret_file(workload, env["VLLM_SRUN_REDIS_PASSWORD_FILE"]["value"]) == "redis-password"
        (tmp_path / name).write_text("p@ss")  # what the kubelet writes: the value, no newline
        os.environ["VLLM_SRUN_REDIS_PASSWORD_FILE"] = str(tmp_path / name)
        try:
            parsed = build_parser().parse_args([args[0], "/models/default", *args[1:]])
        finally:
            del os.environ["VLLM_SRUN_REDIS_PASSWORD_FILE"]
        assert parsed.redis == "redis://:p%40ss@state-redis:6379/0"
        assert parsed.cache_redis == "redis://:p%40ss@cache-redis:6379/0"
    # The app's key file is named through the environment too, and the CLI takes it from there.
    app = container(find(objects, "Deployment", "app"))
    key_file = {e["name"]: e for e in app["env"]}["VLLM_SRUN_API_KEY_FILE"]["value"]
    os.environ["VLLM_SRUN_API_KEY_FILE"] = key_file
    try:
        parsed = build_parser().parse_args([app["args"][0], "/models/default", *app["args"][1:]])
    finally:
        del os.environ["VLLM_SRUN_API_KEY_FILE"]
    assert str(parsed.api_key_file) == key_file and parsed.api_key is None


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
    # `python -m bench`'s own reports (bench.precision's sit beside them and hold no RSS).
    reports = sorted((REPO / "bench" / "reference").glob("minilm-*.txt"))
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


# The Secret the manifests read, created by the operator (kustomization.yaml says how): no value
# of it is in any file here.
SECRET_KEYS = {key: {"name": "vllm-srun", "key": key} for key in ("redis-password", "api-keys")}
REDIS = ("state-redis", "cache-redis")


def workloads(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] in ("Deployment", "StatefulSet")]


def secret_file(workload: dict[str, Any], path: str) -> str:
    """The key of the Secret `vllm-srun` that the kubelet writes at `path`, read-only."""
    mount = next(m for m in container(workload)["volumeMounts"] if Path(path).is_relative_to(m["mountPath"]))
    assert mount.get("readOnly") is True
    volume = next(v for v in workload["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    assert volume["secret"]["secretName"] == "vllm-srun"
    return next(
        i["key"] for i in volume["secret"]["items"] if Path(mount["mountPath"]) / i["path"] == Path(path)
    )


def test_no_secret_value_is_in_the_manifests_and_the_secret_is_documented(
    objects: list[dict[str, Any]],
) -> None:
    assert not [o for o in objects if o["kind"] == "Secret"]
    # Every secret is a file (*_FILE): none is in a container's environment.
    assert not [e for w in workloads(objects) for e in container(w).get("env", []) if "valueFrom" in e]
    volumes = [
        {"name": v["secret"]["secretName"], "key": item["key"]}
        for w in workloads(objects)
        for v in w["spec"]["template"]["spec"].get("volumes", [])
        if "secret" in v
        for item in v["secret"]["items"]
    ]
    assert volumes and all(ref in SECRET_KEYS.values() for ref in volumes)
    assert {v["key"] for v in volumes} == set(SECRET_KEYS)
    for text in ((BASE / "kustomization.yaml").read_text(), (REPO / "docs" / "deployment.md").read_text()):
        assert "create secret generic vllm-srun" in text
        assert all(f"--from-literal={key}=" in text for key in SECRET_KEYS)


def test_the_apps_keys_are_the_secrets_key_file_readable_by_its_user_alone(
    objects: list[dict[str, Any]], tmp_path: Path
) -> None:
    from vllm_srun.app.tenants import read_key_file
    from vllm_srun.cli.secrets import API_KEY_ENV, API_KEY_FILE_ENV

    app = find(objects, "Deployment", "app")
    pod = app["spec"]["template"]["spec"]
    env = {e["name"]: e for e in container(app)["env"]}
    assert API_KEY_ENV not in env  # one key in the env would bypass the file's callers
    path = Path(env[API_KEY_FILE_ENV]["value"])
    assert secret_file(app, str(path)) == "api-keys"
    mount = next(m for m in container(app)["volumeMounts"] if path.is_relative_to(m["mountPath"]))
    secret = next(v for v in pod["volumes"] if v["name"] == mount["name"])["secret"]
    item = next(i for i in secret["items"] if i["key"] == "api-keys")
    # The kubelet writes the file root-owned with the pod's fsGroup: the non-root user reads it
    # through the group, and no one else can.
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]
    assert secret["defaultMode"] & 0o040 and not secret["defaultMode"] & 0o007
    # What `--from-file=api-keys=keys.txt` and `--from-literal=api-keys=KEY` put there is a file
    # the server reads as its callers.
    written = tmp_path / item["path"]
    written.write_text("k1-" + "a" * 32 + "\nk2-" + "b" * 32 + "\n")
    assert len(read_key_file(written)) == 2
    written.write_text("k1-" + "a" * 32)  # --from-literal has no newline
    assert len(read_key_file(written)) == 1


def kubelet_expanded(text: str, env: dict[str, str]) -> str:
    """What the kubelet makes of a command: $(NAME) from the container's env, $$ an escaped $."""
    return re.sub(
        r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]) if m[1] else "$", text
    )


@pytest.mark.parametrize("name", REDIS)
def test_each_redis_reads_the_secrets_password_file(
    objects: list[dict[str, Any]], name: str, tmp_path: Path
) -> None:
    import redis

    from vllm_srun.cli.embedded_redis import find_redis_server

    workload = next(w for w in workloads(objects) if w["metadata"]["name"] == name)
    spec = container(workload)
    env = {e["name"]: e["value"] for e in spec["env"]}
    assert secret_file(workload, env["VLLM_SRUN_REDIS_PASSWORD_FILE"]) == "redis-password"
    assert not [a for a in spec["command"] + spec["args"] if "requirepass" in a and "$password" not in a]
    # The container's command and args, run as the kubelet would, on the bundled redis-server.
    (tmp_path / "redis-password").write_text("p@ss-word")  # the kubelet writes no newline
    local = {"VLLM_SRUN_REDIS_PASSWORD_FILE": str(tmp_path / "redis-password")}
    port = free_port()
    args = [kubelet_expanded(a, local) for a in spec["args"]]
    args[args.index("--dir") + 1] = str(tmp_path)
    argv = (
        [kubelet_expanded(a, local) for a in spec["command"]]
        + args
        + ["--port", str(port), "--bind", "127.0.0.1"]
    )
    path = f"{Path(find_redis_server()).parent}:{os.environ['PATH']}"
    proc = subprocess.Popen(
        argv, env={"PATH": path, **local}, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis(port=port, password="p@ss-word").ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.05)
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port).ping()
        for probe in ("readinessProbe", "livenessProbe"):
            if probe in spec:
                command = spec[probe]["exec"]["command"]
                command = [*command[:2], command[2].replace("redis-cli", f"redis-cli -p {port}")]
                assert subprocess.run(command, env={"PATH": path, **local}, timeout=10).returncode == 0
        assert b"p@ss-word" not in Path(f"/proc/{proc.pid}/cmdline").read_bytes()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    # An empty file does not start a Redis open to all.
    (tmp_path / "redis-password").write_text("")
    empty = subprocess.run(argv, env={"PATH": path, **local}, capture_output=True, text=True, timeout=10)
    assert empty.returncode != 0 and "no Redis password" in empty.stderr


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Kubernetes' label selector semantics for matchLabels and In / NotIn / Exists expressions."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        value, op = labels.get(expr["key"]), expr["operator"]
        if op == "In" and value not in expr["values"]:
            return False
        if op == "NotIn" and value in expr["values"]:
            return False
        if op == "Exists" and value is None:
            return False
        if op == "DoesNotExist" and value is not None:
            return False
    return True


def admitted(
    policies: list[dict[str, Any]], target: dict[str, str], source: dict[str, str], port: int
) -> bool:
    """Whether a pod labelled `source` (same namespace) may open `port` on a pod labelled `target`."""
    applying = [p for p in policies if selects(p["spec"]["podSelector"], target)]
    if not any("Ingress" in p["spec"]["policyTypes"] for p in applying):
        return True
    for policy in applying:
        for rule in policy["spec"].get("ingress", []):
            peers = rule.get("from")
            ports = rule.get("ports")
            assert peers is None or all(set(peer) == {"podSelector"} for peer in peers), "only pod peers"
            if ports is not None and not any(p["port"] == port for p in ports):
                continue
            if peers is None or any(selects(peer["podSelector"], source) for peer in peers):
                return True
    return False


def test_only_app_and_worker_pods_reach_redis(objects: list[dict[str, Any]]) -> None:
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    labels = {w["metadata"]["name"]: w["spec"]["template"]["metadata"]["labels"] for w in workloads(objects)}
    stranger = {"app.kubernetes.io/name": "something-else"}
    lookalike = {"app.kubernetes.io/name": "vllm-srun", "app.kubernetes.io/component": "debug"}
    for name in REDIS:
        assert admitted(policies, labels[name], labels["app"], 6379)
        assert admitted(policies, labels[name], labels["worker"], 6379)
        for source in (
            stranger,
            lookalike,
            {},
            labels["cache-redis" if name == "state-redis" else "state-redis"],
        ):
            assert not admitted(policies, labels[name], source, 6379), (name, source)
        assert not admitted(policies, labels[name], labels["app"], 6380)
    # The app itself stays reachable (the Service on port 8000).
    assert admitted(policies, labels["app"], stranger, 8000)


def test_every_pod_runs_the_restricted_profile(objects: list[dict[str, Any]]) -> None:
    for workload in workloads(objects):
        name = workload["metadata"]["name"]
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] > 0, name
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert pod["automountServiceAccountToken"] is False, name
        for c in pod["containers"] + pod.get("initContainers", []):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True, name
            assert sc["capabilities"] == {"drop": ["ALL"]}, name
            assert "privileged" not in sc and "add" not in sc["capabilities"], name
            # What is written goes to a volume: an emptyDir or the state's claim.
            mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            written = [env[v] for v in ("HF_HOME",) if v in env] + (
                ["/tmp"] if c["image"].startswith("vllm-srun") else []
            )
            if c["image"].startswith("redis"):
                written.append(c["args"][c["args"].index("--dir") + 1])
            assert written and all(path in mounts for path in written), (name, written, mounts)
        claims = {t["metadata"]["name"] for t in workload["spec"].get("volumeClaimTemplates", [])}
        # Volumes are bounded emptyDirs, or the Secret mounted read-only (its keys, nothing written).
        read_only = {
            m["name"] for c in pod["containers"] for m in c.get("volumeMounts", []) if m.get("readOnly")
        }
        for volume in pod.get("volumes", []):
            if "secret" in volume:
                assert volume["name"] in read_only, (name, volume)
                continue
            assert "emptyDir" in volume and volume["emptyDir"].get("sizeLimit"), (name, volume)
        assert claims <= {"data"}


def test_images_are_pinned_and_probes_hold_under_load(objects: list[dict[str, Any]]) -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    for workload in workloads(objects):
        for c in workload["spec"]["template"]["spec"]["containers"]:
            image, _, tag = c["image"].partition(":")
            assert tag and tag != "latest", c["image"]
            assert tag == version if image == "vllm-srun" else re.fullmatch(r"\d+\.\d+\.\d+-alpine", tag)
            for probe in ("readinessProbe", "livenessProbe"):
                if probe in c:
                    # The default timeout is 1 s: a replica busy with a burst would be restarted.
                    assert c[probe].get("timeoutSeconds", 1) >= 3, (c["name"], probe)
    assert "livenessProbe" in container(find(objects, "Deployment", "app"))


def test_redis_memory_is_bounded_below_the_pod_limit(objects: list[dict[str, Any]]) -> None:
    for name, policy in (("state-redis", "noeviction"), ("cache-redis", "allkeys-lru")):
        redis = container(next(w for w in workloads(objects) if w["metadata"]["name"] == name))
        args = redis["args"]
        assert args[args.index("--maxmemory-policy") + 1] == policy
        maxmemory = re.fullmatch(r"(\d+)mb", args[args.index("--maxmemory") + 1])
        assert maxmemory, "maxmemory in mb"
        limit = mebibytes(redis["resources"]["limits"]["memory"])
        # Headroom for the append-only file's rewrite fork and client buffers: a full state Redis
        # refuses writes (503) and is never killed for memory.
        assert int(maxmemory.group(1)) <= 0.8 * limit, name
    state = container(find(objects, "StatefulSet", "state-redis"))["resources"]
    assert state["requests"]["memory"] == state["limits"]["memory"], "guaranteed: never reclaimed"
